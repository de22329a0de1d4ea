"""The simulator's counters and behaviour in force, shared by its handler threads."""

from __future__ import annotations

import copy
import random
import threading
import time
from typing import Any

from herd.limits.base import key_id as herd_key_id
from herd.testing.simulator import promptcache
from herd.testing.simulator.config import SimConfig
from herd.testing.simulator.limits import MAX_BUCKETS, RateLimits, Verdict, key_id
from herd.testing.simulator.spells import spell_on

TAGGED_MAX = 1_000_000  # tagged-call records kept until the next reset


class SimState:
    """Configuration and counters, shared by the handler threads under one lock."""

    def __init__(self, config: SimConfig, verbose: bool = False) -> None:
        self.initial = copy.deepcopy(config)
        self.config = config
        self.verbose = verbose
        self.lock = threading.Lock()
        self.rng = random.Random(config.seed)
        self.in_flight = 0
        self.generation = 0
        self.started = time.time()
        self.limits = RateLimits(config.rpm, config.tpm)
        self.prompt_cache = promptcache.PromptCache()
        self._zero()

    def _zero(self) -> None:
        self.calls = 0
        self.by_status: dict[str, int] = {}
        self.by_model: dict[str, int] = {}
        self.by_api: dict[str, int] = {}
        self.by_outcome: dict[str, int] = {}
        self.disconnected = 0
        self.rate_limited = 0
        self.spell_errors: dict[str, int] = {}  # model -> calls a spell answered with an error
        self.billed = 0
        self.billed_tokens = [0, 0]
        self.input_tokens = 0
        self.output_tokens = 0
        self.cached_input_tokens = 0
        self.cache_write_tokens = 0
        self.prompt_cache_keys: set[str] = set()
        self.max_in_flight = self.in_flight
        self.since = time.time()
        # Calls tagged by the client (``x-sim-tag``, e.g. "job:attempt:pid"), so a test can
        # tell which caller paid for which call: tag -> [{start, end, status}] (wall clock;
        # status None when no answer was delivered).
        self.tagged: dict[str, list[dict[str, Any]]] = {}
        self.tagged_calls = 0
        # Per key id (herd.limits.key_id): calls past the key check, 429s, billed calls.
        self.by_key: dict[str, dict[str, int]] = {}

    def reset(self) -> None:
        with self.lock:
            self.generation += 1
            self.config = copy.deepcopy(self.initial)
            self.rng = random.Random(self.config.seed)
            self.limits = RateLimits(self.config.rpm, self.config.tpm)
            self.prompt_cache = promptcache.PromptCache()
            self._zero()

    def configure(self, changes: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            seed = self.config.seed
            self.config.update(changes)
            if "seed" in changes and self.config.seed != seed:
                self.rng = random.Random(self.config.seed)
            if "rpm" in changes or "tpm" in changes:  # new limits start with full buckets
                self.limits = RateLimits(self.config.rpm, self.config.tpm)
            return self.config.public()

    def begin(self, api: str, model: str) -> int:
        with self.lock:
            self.calls += 1
            self.by_api[api] = self.by_api.get(api, 0) + 1
            self.by_model[model] = self.by_model.get(model, 0) + 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            return self.generation

    def end(self) -> None:
        with self.lock:
            self.in_flight -= 1

    def draw(self, generation: int) -> tuple[str, float]:
        """The outcome of the next call and its latency."""
        with self.lock:
            cfg = self.config
            if cfg.script and generation == self.generation:
                outcome = cfg.script.pop(0)
            else:
                outcome, r, acc = "ok", self.rng.random(), 0.0
                for name, p in cfg.fail_rates.items():
                    acc += p
                    if r < acc:
                        outcome = name
                        break
            low, high = cfg.latency
            latency = low if high == low else self.rng.uniform(low, high)
            if generation == self.generation:
                name = outcome.partition(":")[0]
                self.by_outcome[name] = self.by_outcome.get(name, 0) + 1
            return outcome, latency

    def answered(
        self, generation: int, status: int, tokens: tuple[int, int] = (0, 0), sign: int = 1
    ) -> None:
        """Count an answer (``sign=-1`` takes back one that could not be delivered)."""
        with self.lock:
            if generation != self.generation:
                return
            self.by_status[str(status)] = self.by_status.get(str(status), 0) + sign
            if not self.by_status[str(status)]:
                del self.by_status[str(status)]
            self.input_tokens += sign * tokens[0]
            self.output_tokens += sign * tokens[1]

    def _count_key(self, generation: int, key: str | None, what: str) -> None:
        """One more ``what`` for ``key`` (the lock held); bounded like the buckets."""
        if generation != self.generation:
            return
        ident = herd_key_id(key or None)
        counts = self.by_key.get(ident)
        if counts is None:
            if len(self.by_key) >= MAX_BUCKETS:
                return
            counts = self.by_key[ident] = {"calls": 0, "rate_limited": 0, "billed": 0}
        counts[what] += 1

    def known_key(self, key: str | None) -> bool:
        """Whether ``key`` is one of the config's ``keys`` (a pool's keys are accepted
        beside the simulator's own)."""
        with self.lock:
            return key is not None and key in self.config.keys

    def admit(self, generation: int, key: str | None, model: str, tokens: int) -> Verdict | None:
        """Weigh a call against the limits (None when there are none); count a refusal."""
        with self.lock:
            self._count_key(generation, key, "calls")
            rule = self.config.keys.get(key or "")
            rpm, tpm = (rule.rpm, rule.tpm) if rule else (None, None)
            if not (self.limits.active or rpm or tpm):
                return None
            verdict = self.limits.admit(key_id(key), model, tokens, rpm=rpm, tpm=tpm)
            if not verdict.admitted and generation == self.generation:
                self.rate_limited += 1
                self._count_key(generation, key, "rate_limited")
            return verdict

    def refused_key(self, key: str | None) -> bool:
        """Whether ``key`` is one the config says the provider refuses (spells.KeyRule)."""
        with self.lock:
            rule = self.config.keys.get(key or "")
            return bool(rule and rule.refused)

    def spell(self, generation: int, model: str) -> int | None:
        """The status a spell over ``model`` answers this call with, counted; None if none."""
        with self.lock:
            found = spell_on(self.config.spells, model, time.monotonic())
            if found is None or (found.rate < 1 and self.rng.random() >= found.rate):
                return None
            if generation == self.generation:
                self.spell_errors[model] = self.spell_errors.get(model, 0) + 1
            return found.status

    def bill(self, generation: int, tokens: tuple[int, int], key: str | None = None) -> None:
        """A call began generating: the provider's bill counts it, answer delivered or not."""
        with self.lock:
            self._count_key(generation, key, "billed")
            if generation == self.generation:
                self.billed += 1
                self.billed_tokens[0] += tokens[0]
                self.billed_tokens[1] += tokens[1]

    def cache_prompt(
        self, generation: int, api: str, key: str | None, model: str, body: dict[str, Any]
    ) -> tuple[int, int]:
        """The prefix tokens a generating call reads from the prompt cache and writes to it."""
        found = promptcache.prefix(api, model, body)
        with self.lock:
            counted = generation == self.generation
            asked = body.get("prompt_cache_key")
            room = len(self.prompt_cache_keys) < promptcache.MAX_KEYS_SEEN
            if counted and isinstance(asked, str) and room:
                self.prompt_cache_keys.add(asked)
            if found is None:
                return 0, 0
            prefix, tokens, factor = found
            lifetime = self.config.prompt_cache_ttl * factor
            hit = self.prompt_cache.use((key_id(key), model, prefix), lifetime, time.time())
            read, written = (tokens, 0) if hit else (0, tokens)
            if api == "openai":
                written = 0  # OpenAI reports (and charges) no cache write
            if counted:
                self.cached_input_tokens += read
                self.cache_write_tokens += written
            return read, written

    def tag_call(self, tag: str) -> dict[str, Any] | None:
        """Start the record of a tagged call (bounded: at most TAGGED_MAX are kept)."""
        with self.lock:
            if self.tagged_calls >= TAGGED_MAX:
                return None
            self.tagged_calls += 1
            record: dict[str, Any] = {"start": time.time(), "end": None, "status": None}
            self.tagged.setdefault(tag, []).append(record)
            return record

    def calls_by_tag(self) -> dict[str, Any]:
        with self.lock:
            return {
                "tagged_calls": self.tagged_calls,
                "tags": {tag: [dict(r) for r in recs] for tag, recs in self.tagged.items()},
            }

    def hung_up(self, generation: int) -> None:
        with self.lock:
            if generation == self.generation:
                self.disconnected += 1

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "calls": self.calls,
                "by_status": dict(self.by_status),
                "by_model": dict(self.by_model),
                "by_api": dict(self.by_api),
                "by_outcome": dict(self.by_outcome),
                "disconnected": self.disconnected,
                "rate_limited": self.rate_limited,
                "spell_errors": dict(self.spell_errors),
                "billed": self.billed,
                "billed_tokens": {
                    "input": self.billed_tokens[0],
                    "output": self.billed_tokens[1],
                    "total": sum(self.billed_tokens),
                },
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
                "tokens": {
                    "input": self.input_tokens,
                    "output": self.output_tokens,
                    "total": self.input_tokens + self.output_tokens,
                },
                "cached_input_tokens": self.cached_input_tokens,
                "cache_write_tokens": self.cache_write_tokens,
                "prompt_cache_keys": sorted(self.prompt_cache_keys),
                "by_key": {k: dict(v) for k, v in self.by_key.items()},
                "since": self.since,
                "seconds": time.time() - self.since,
            }
