"""The simulator's HTTP server: OpenAI chat completions and Anthropic messages.

A ``ThreadingHTTPServer`` (stdlib, one thread per connection, HTTP/1.1 keep-alive):
no dependency, and a thread that waits out the latency can watch its socket, so a
client that hangs up before the answer is seen at once (``select`` + ``MSG_PEEK``
reading end-of-file) and counted as ``disconnected``.

Routes::

    POST /v1/chat/completions   (also /chat/completions)   OpenAI wire format
    POST /v1/messages                                        Anthropic wire format
    GET  /v1/models                                          a one-model list
    /v1/files, /v1/batches, /v1/messages/batches             the Batch APIs (``batches.py``)
    GET  /_sim/stats            counters since start or the last reset
    GET  /_sim/calls            calls that carried an ``x-sim-tag`` header, by tag
    GET  /_sim/config           the behaviour in force (the key masked)
    POST /_sim/config           change the behaviour: a partial JSON object
    POST /_sim/reset            counters, script and behaviour back to start-up

When the simulator has a key, ``POST /_sim/config`` needs it too (``Authorization:
Bearer KEY`` or ``x-api-key: KEY``), else 401: whoever may call the model must not
be able to switch its key off. ``POST /_sim/reset`` needs the start-up key
(``--api-key``), as it only goes back to what the operator started. Request bodies
are bounded: past ``MAX_BODY_BYTES`` (32 MiB, the size Anthropic's API takes) the
answer is 413 and the body is not read.

What a model call gets is decided in this order: a wrong or missing key (when the
simulator has one) → 401; an Anthropic call without ``anthropic-version`` → 400;
``stream: true`` → 400; then the rate limits (``rpm``, ``tpm``; ``limits.py``): a
call that does not fit is answered 429 at once; then the next entry of the script if
any, else a random draw against the failure rates, else a normal answer. The latency
applies to every outcome except 429 (rate limiters answer at once) and ``hang`` (which
never answers: it waits until the client goes away, or ``hang_max`` seconds). With
limits set, every answer from the limits on carries the wire format's rate-limit
headers (OpenAI ``x-ratelimit-*``, Anthropic ``anthropic-ratelimit-*``).

Counters of ``/_sim/stats`` beyond the obvious ones: ``rate_limited`` is the number of
429s sent because a limit was full (not the scripted or drawn ones, which count under
``by_outcome``); ``billed`` is the number of calls that passed the limits and whose
draw was a generated answer (``ok``, ``malformed`` or ``schema_invalid``), counted when
generation begins, so a call whose client hung up during the latency is billed too,
as a provider bills it; ``billed_tokens`` are those calls' input and output tokens.
Calls refused (401, 400, 429) and drawn failures (5xx, ``hang``) are not billed.
Requests answered in batches are counted apart: ``batches``, ``batch_billed`` and
``batch_tokens`` (``batches.py``).
``cached_input_tokens`` and ``cache_write_tokens`` are the prompt-cache reads and writes
of billed calls (promptcache.py), ``prompt_cache_keys`` the distinct OpenAI
``prompt_cache_key`` values calls carried.
"""

from __future__ import annotations

import copy
import hmac
import json
import logging
import random
import select
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from herd.errors import ConfigError
from herd.llm.simulator import batches, content, promptcache
from herd.llm.simulator.limits import RateLimits, Verdict, headers_for, key_id

log = logging.getLogger("herd.llm.simulator")

MAX_BODY_BYTES = 32 * 1024 * 1024  # a request body past this is refused with 413
TAGGED_MAX = 1_000_000  # tagged-call records kept until the next reset
OUTCOMES = ("ok", "rate_limit", "server_error", "malformed", "schema_invalid", "hang")
ALIASES = {"429": "rate_limit", "500": "server_error", "invalid": "schema_invalid"}
CONTENT_MODES = ("schema", "echo", "fixed")


@dataclass
class SimConfig:
    """The simulator's behaviour. ``latency`` is ``(low, high)`` seconds, drawn uniformly."""

    latency: tuple[float, float] = (0.0, 0.0)
    content: str = "schema"  # schema: JSON from the requested schema (text without one)
    fixed_text: str = ""  # the answer when content == "fixed"
    fail_rates: dict[str, float] = field(default_factory=dict)  # outcome or status -> P
    script: list[str] = field(default_factory=list)  # outcomes for the next calls, in order
    retry_after: float = 1.0  # seconds, sent with every 429
    api_key: str | None = None  # when set, calls must carry it
    hang_max: float = 3600.0
    seed: int | None = None  # for the failure draws
    rpm: int | None = None  # requests per minute, per key and model (limits.py)
    tpm: int | None = None  # tokens (input + max output) per minute, per key and model
    # Providers send Retry-After with a limit's 429; off, a client must read the reset headers.
    limit_retry_after: bool = True
    batch_latency: float = 1.0  # seconds from a batch's creation to its end (batches.py)
    batch_expire: bool = False  # batches created while set end expired, nothing answered
    prompt_cache_ttl: float = 300.0  # seconds a cached prompt prefix lives (promptcache.py)

    def update(self, changes: dict[str, Any]) -> None:
        """Apply a partial JSON config; raise ``ConfigError`` naming what is wrong."""
        unknown = set(changes) - {f for f in asdict(self)}
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(sorted(unknown))}")
        new = copy.deepcopy(self)
        for key, value in changes.items():
            if key == "latency":
                new.latency = parse_latency(value)
            elif key == "content":
                if value not in CONTENT_MODES:
                    raise ConfigError(f"content must be one of {', '.join(CONTENT_MODES)}")
                new.content = value
            elif key == "fail_rates":
                new.fail_rates = parse_rates(value)
            elif key == "script":
                if not isinstance(value, list):
                    raise ConfigError("script must be a list of outcomes")
                new.script = [parse_outcome(str(v)) for v in value]
            elif key in ("retry_after", "hang_max", "batch_latency", "prompt_cache_ttl"):
                setattr(new, key, _nonneg(key, value))
            elif key == "seed":
                new.seed = None if value is None else int(value)
            elif key in ("limit_retry_after", "batch_expire"):
                if not isinstance(value, bool):
                    raise ConfigError(f"{key} must be true or false")
                setattr(new, key, value)
            elif key in ("rpm", "tpm"):
                setattr(new, key, parse_limit(key, value))
            elif key in ("fixed_text", "api_key"):
                setattr(new, key, None if value is None else str(value))
        self.__dict__.update(new.__dict__)

    def public(self) -> dict[str, Any]:
        data = asdict(self)
        data["latency"] = list(self.latency)
        data["api_key"] = "***" if self.api_key else None
        return data


def parse_latency(value: Any) -> tuple[float, float]:
    """``0.5``, ``"0.5"``, ``[0.2, 1.5]`` or ``"0.2:1.5"`` (uniform between the two)."""
    if isinstance(value, str):
        value = [float(v) for v in value.split(":")] if ":" in value else float(value)
    if isinstance(value, int | float):
        value = [value, value]
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ConfigError("latency must be seconds or [low, high]")
    low, high = _nonneg("latency", value[0]), _nonneg("latency", value[1])
    if high < low:
        raise ConfigError("latency: high is below low")
    return low, high


def parse_limit(name: str, value: Any) -> int | None:
    """A per-minute limit: a positive whole number, or null/0 for none."""
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a whole number per minute (or null for none)") from None
    if number < 0 or number != float(value):
        raise ConfigError(f"{name} must be a whole number per minute, not {value!r}")
    return number or None


def parse_outcome(item: str) -> str:
    """An outcome name, an alias (429, 500, invalid), a status (503), or ``429:SECONDS``."""
    name, _, arg = item.strip().partition(":")
    name = ALIASES.get(name, name)
    if name in OUTCOMES or (name.isdigit() and len(name) == 3):
        if arg:
            float(arg)  # a Retry-After for this one answer
            return f"{name}:{arg}"
        return name
    raise ConfigError(f"unknown outcome {item!r}: use {', '.join(OUTCOMES)} or a status code")


def parse_rates(value: Any) -> dict[str, float]:
    """``{"429": 0.1, "malformed": 0.05}`` or ``"429=0.1,malformed=0.05"``."""
    if isinstance(value, str):
        pairs = [p.split("=", 1) for p in value.split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise ConfigError("fail rates look like 429=0.1,malformed=0.05")
        value = {k: v for k, v in pairs}
    if not isinstance(value, dict):
        raise ConfigError("fail_rates must map outcomes to probabilities")
    rates = {parse_outcome(str(k)): float(v) for k, v in value.items()}
    if any(not 0 <= p <= 1 for p in rates.values()) or sum(rates.values()) > 1 + 1e-9:
        raise ConfigError("fail rates are probabilities that add up to at most 1")
    return rates


def _nonneg(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number of seconds") from None
    if number < 0:
        raise ConfigError(f"{name} must not be negative")
    return number


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

    def admit(self, generation: int, key: str | None, model: str, tokens: int) -> Verdict | None:
        """Weigh a call against the limits (None when there are none); count a refusal."""
        with self.lock:
            if not self.limits.active:
                return None
            verdict = self.limits.admit(key_id(key), model, tokens)
            if not verdict.admitted and generation == self.generation:
                self.rate_limited += 1
            return verdict

    def bill(self, generation: int, tokens: tuple[int, int]) -> None:
        """A call began generating: the provider's bill counts it, answer delivered or not."""
        with self.lock:
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
                "since": self.since,
                "seconds": time.time() - self.since,
            }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: SimState) -> None:
        self.state = state
        self.batches = batches.BatchStore(state)
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-exchange is a normal event here, not a traceback.
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    server_version = "herd-simulator/0.1"
    _tagged: dict[str, Any] | None = None  # the record of the tagged call being answered
    _limit_headers: dict[str, str] = {}  # rate-limit headers of the call being answered

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes; without this, Nagle's algorithm and the
        # client's delayed ACK add ~40 ms to every answer.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.server.state.verbose:
            super().log_message(format, *args)

    # Routing ------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        state = self.server.state
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/_sim/stats":
            self._json(200, {**state.stats(), **self.server.batches.stats()})
        elif path == "/_sim/calls":
            self._json(200, state.calls_by_tag())
        elif path == "/_sim/config":
            with state.lock:
                self._json(200, state.config.public())
        elif path in ("/v1/models", "/models"):
            self._json(200, {"object": "list", "data": [{"id": "sim", "object": "model"}]})
        elif path in ("/health", "/_sim/health"):
            self._json(200, {"ok": True})
        elif batches.owns(path):
            self.server.batches.serve(self, "GET", self.path)
        else:
            self._json(404, {"error": {"message": f"no route GET {path}", "type": "not_found"}})

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0].rstrip("/")
        if batches.owns(path):  # reads its own body: batch files are larger than a call
            self.server.batches.serve(self, "POST", self.path)
            return
        body = self._read_body()
        if body is None:
            return
        state = self.server.state
        if path in ("/v1/chat/completions", "/chat/completions"):
            self._model_call("openai", body)
        elif path == "/v1/messages":
            self._model_call("anthropic", body)
        elif path == "/_sim/reset":
            if not self._control_allowed(state.initial.api_key):
                return
            state.reset()
            self.server.batches.reset()
            self._json(200, {"ok": True})
        elif path == "/_sim/config":
            with state.lock:
                key = state.config.api_key
            if not self._control_allowed(key):
                return
            if not isinstance(body, dict):
                self._json(400, {"error": {"message": "config must be a JSON object"}})
                return
            try:
                self._json(200, state.configure(body))
            except (ConfigError, ValueError) as exc:
                self._json(400, {"error": {"message": str(exc), "type": "invalid_config"}})
        else:
            self._json(404, {"error": {"message": f"no route POST {path}", "type": "not_found"}})

    def do_DELETE(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0].rstrip("/")
        if batches.owns(path):
            self.server.batches.serve(self, "DELETE", self.path)
        else:
            self._json(404, {"error": {"message": f"no route DELETE {path}", "type": "not_found"}})

    # Model calls --------------------------------------------------------------------

    def _model_call(self, api: str, body: Any) -> None:
        state = self.server.state
        if not isinstance(body, dict):
            body = {}
        model = str(body.get("model") or "unknown")
        generation = state.begin(api, model)
        tag = self.headers.get("x-sim-tag")
        self._tagged = state.tag_call(tag) if tag else None
        self._limit_headers = {}
        self._in_flight = True
        try:
            self._answer(api, model, body, generation)
        finally:
            self._done()
            if self._tagged is not None:
                with state.lock:
                    self._tagged["end"] = time.time()

    def _done(self) -> None:
        """The call is over for the counters (before its answer leaves: no race with readers)."""
        if getattr(self, "_in_flight", False):
            self._in_flight = False
            self.server.state.end()

    def _answer(self, api: str, model: str, body: dict[str, Any], generation: int) -> None:
        state = self.server.state
        with state.lock:
            key = state.config.api_key
            retry_after = state.config.retry_after
            hang_max = state.config.hang_max
        given = (
            self.headers.get("x-api-key")
            if api == "anthropic"
            else (self.headers.get("authorization") or "").removeprefix("Bearer ").strip()
        )
        if key is not None and not _same_key(given, key):
            # Like the real services, the refusal names the key it got: the clients must
            # keep it out of their errors and logs.
            self._error(api, generation, 401, "authentication_error", f"Invalid API key: {given}")
            return
        if api == "anthropic" and not self.headers.get("anthropic-version"):
            self._error(
                api, generation, 400, "invalid_request_error", "anthropic-version header missing"
            )
            return
        if body.get("stream"):
            self._error(api, generation, 400, "invalid_request_error", "stream is not simulated")
            return
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            self._error(api, generation, 400, "invalid_request_error", "messages is required")
            return
        try:
            req = _Request.of(api, body)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            message = f"the simulator cannot read this request: {type(exc).__name__}: {exc}"
            self._error(api, generation, 400, "invalid_request_error", message)
            return

        verdict = state.admit(generation, given, model, _weight(req, body))
        if verdict is not None:
            with state.lock:
                send_after = state.config.limit_retry_after
            self._limit_headers = headers_for(api, verdict, retry_after=send_after)
            if not verdict.admitted:
                self._refuse(api, generation, model, verdict)
                return

        outcome, latency = state.draw(generation)
        name, _, arg = outcome.partition(":")
        if name == "rate_limit":
            after = float(arg) if arg else retry_after
            self._error(
                api,
                generation,
                429,
                "rate_limit_error",
                "Rate limit reached (simulated).",
                {"retry-after": f"{after:g}"},
            )
            return
        text = ""
        tokens = (0, 0)
        cache = (0, 0)  # prompt-cache tokens read, written
        if name in ("ok", "malformed", "schema_invalid"):
            # Generation begins: billed from here even if the client hangs up before the end.
            text, tokens = generate(state, req, name)
            state.bill(generation, tokens)
            cache = state.cache_prompt(generation, api, given, model, body)
        if name == "hang":
            if self._client_gone(hang_max):
                state.hung_up(generation)
            self.close_connection = True
            return
        if self._client_gone(latency):
            state.hung_up(generation)
            self.close_connection = True
            return
        if name == "server_error":
            self._error(api, generation, 500, "api_error", "Internal server error (simulated).")
            return
        if name.isdigit():
            status = int(name)
            headers = {}
            if arg or status in (429, 503, 529):
                headers["retry-after"] = f"{float(arg) if arg else retry_after:g}"
            self._error(api, generation, status, "api_error", f"Simulated {status}.", headers)
            return

        self._send(
            generation, 200, answer_payload(api, model, req, text, tokens, cache), tokens=tokens
        )

    def _refuse(self, api: str, generation: int, model: str, verdict: Verdict) -> None:
        """429 for a limit, in the provider's error JSON, so its SDK raises RateLimitError."""
        scope = verdict.scope or "requests"
        dim = next((d for d in verdict.dimensions if d.name == scope), None)
        limit = dim.limit if dim is not None else 0
        asked = 1 if scope == "requests" else verdict.requested
        wait = verdict.retry_after or 0.0
        per = "RPM" if scope == "requests" else "TPM"
        message = (
            f"Rate limit reached for {model} on {scope} per min ({per}): Limit {limit},"
            f" Requested {asked}. Please try again in {wait:.3f}s."
        )
        if asked > limit:
            message = (
                f"Request too large for {model} on {scope} per min ({per}):"
                f" Limit {limit}, Requested {asked}."
            )
        if api == "anthropic":
            self._error(api, generation, 429, "rate_limit_error", message)
        else:
            self._error(api, generation, 429, scope, message, code="rate_limit_exceeded")

    @staticmethod
    def _content(state: SimState, req: _Request, outcome: str) -> str:
        with state.lock:
            mode, fixed = state.config.content, state.config.fixed_text
        # The same prompt gets the same answer, whichever wire format and model asked.
        turns = [[m.get("role"), _text(m.get("content"))] for m in req.messages if _is_dict(m)]
        rng = random.Random(content.seed_of(turns, req.system, req.schema))
        if mode == "echo":
            text = req.user_text
        elif mode == "fixed":
            text = fixed
        elif req.schema is not None:
            value = content.generate(req.schema, rng)
            if outcome == "schema_invalid":
                value = content.violate(value, req.schema)
            text = json.dumps(value, ensure_ascii=False)
        elif req.json_object:
            value = {"answer": content.sentence(rng)}
            text = json.dumps(value if outcome != "schema_invalid" else ["not", "an", "object"])
        else:
            text = content.sentence(rng, 20)
        if outcome == "malformed":
            text = content.malformed(text if text.startswith(("{", "[")) else json.dumps(text))
        return text

    # Plumbing -----------------------------------------------------------------------

    def _client_gone(self, seconds: float) -> bool:
        """Wait ``seconds``; True as soon as the client closes its end of the connection."""
        deadline = time.monotonic() + seconds
        sock = self.connection
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                readable, _, _ = select.select([sock], [], [], remaining)
                if not readable:
                    return False
                if not sock.recv(1, socket.MSG_PEEK):
                    return True  # end of file: the client hung up
            except (OSError, ValueError):
                return True
            # Bytes of a next (pipelined) request: nothing more to learn, wait it out.
            time.sleep(max(0.0, deadline - time.monotonic()))
            return False

    def _control_allowed(self, key: str | None) -> bool:
        """True if the call may change the simulator; else it is answered 401."""
        bearer = (self.headers.get("authorization") or "").removeprefix("Bearer ").strip()
        if key is None or _same_key(bearer, key) or _same_key(self.headers.get("x-api-key"), key):
            return True
        message = "the simulator's control routes need its API key (Authorization: Bearer KEY)"
        self._json(401, {"error": {"message": message, "type": "authentication_error"}})
        return False

    def _read_body(self) -> Any:
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self._json(400, {"error": {"message": "bad Content-Length"}})
            return None
        if length > MAX_BODY_BYTES:
            # Not read: the connection closes instead, so its bytes cost nothing.
            self.close_connection = True
            message = f"request body of {length} bytes is over the limit of {MAX_BODY_BYTES}"
            self._json(
                413,
                {"error": {"message": message, "type": "request_too_large"}},
                {"connection": "close"},
            )
            return None
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            self._json(400, {"error": {"message": "body is not JSON", "type": "invalid_json"}})
            return None

    def _error(
        self,
        api: str,
        generation: int,
        status: int,
        kind: str,
        message: str,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        if api == "anthropic":
            payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
        else:
            payload = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        self._send(generation, status, payload, headers)

    def _send(
        self,
        generation: int,
        status: int,
        payload: Any,
        headers: dict[str, str] | None = None,
        tokens: tuple[int, int] = (0, 0),
    ) -> None:
        """Answer a model call; counted before the bytes leave, so a client that reads the
        stats right after its answer sees it counted."""
        state = self.server.state
        state.answered(generation, status, tokens)
        self._done()
        if self._limit_headers:
            headers = {**self._limit_headers, **(headers or {})}
        if not self._json(status, payload, headers):
            state.answered(generation, status, tokens, sign=-1)
            state.hung_up(generation)
        elif self._tagged is not None:
            with state.lock:
                self._tagged["status"] = status

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> bool:
        """Send a JSON answer; False if the client had gone."""
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.send_header("x-request-id", uuid.uuid4().hex)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True
            return False
        return True


@dataclass
class _Request:
    """What both wire formats ask, in one shape."""

    messages: list[Any]
    system: str
    schema: Any
    json_object: bool
    tool: str | None
    prefill: str

    @classmethod
    def of(cls, api: str, body: dict[str, Any]) -> _Request:
        messages = list(body.get("messages") or [])
        schema: Any = None
        json_object = False
        tool: str | None = None
        system = ""
        prefill = ""
        if api == "openai":
            system = "\n".join(
                _text(m.get("content"))
                for m in messages
                if isinstance(m, dict) and m.get("role") in ("system", "developer")
            )
            messages = [
                m
                for m in messages
                if not (isinstance(m, dict) and m.get("role") in ("system", "developer"))
            ]
            fmt = body.get("response_format") or {}
            if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
                schema = (fmt.get("json_schema") or {}).get("schema", {})
            json_object = isinstance(fmt, dict) and fmt.get("type") == "json_object"
        else:
            system = _text(body.get("system"))
            out = (body.get("output_config") or {}).get("format") or body.get("output_format")
            if isinstance(out, dict) and out.get("type") == "json_schema":
                schema = out.get("schema", {})
            choice = body.get("tool_choice") or {}
            tools = body.get("tools") or []
            if isinstance(choice, dict) and choice.get("type") == "tool":
                for t in tools:
                    if isinstance(t, dict) and t.get("name") == choice.get("name"):
                        schema, tool = t.get("input_schema", {}), str(t["name"])
            last = messages[-1] if messages else None
            if isinstance(last, dict) and last.get("role") == "assistant":
                prefill = _text(last.get("content"))
                messages = messages[:-1]
        return cls(messages, system, schema, json_object, tool, prefill)

    @property
    def user_text(self) -> str:
        users = [m for m in self.messages if isinstance(m, dict) and m.get("role") == "user"]
        return _text(users[-1].get("content")) if users else ""

    @property
    def prompt_text(self) -> str:
        parts = [self.system] + [
            _text(m.get("content")) for m in self.messages if isinstance(m, dict)
        ]
        return "\n".join(parts)


def generate(state: SimState, req: _Request, outcome: str) -> tuple[str, tuple[int, int]]:
    """The text a generated outcome answers and its (input, output) tokens: one engine for
    the synchronous routes and the batches (``batches.py``), so both bill alike."""
    text = _Handler._content(state, req, outcome)
    return text, (content.estimate_tokens(req.prompt_text), max(1, content.estimate_tokens(text)))


def answer_payload(
    api: str,
    model: str,
    req: _Request,
    text: str,
    tokens: tuple[int, int],
    cache: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    """The 200 body of a model call in the ``api``'s wire format; ``cache``: the prompt
    cache's tokens (read, written) that its usage reports."""
    if api == "openai":
        return _openai_answer(model, text, tokens, cache)
    return _anthropic_answer(model, req, text, tokens, cache)


def _weight(req: _Request, body: dict[str, Any]) -> int:
    """Tokens a call is charged at admission: its input plus the most output it allows."""
    most = body.get("max_completion_tokens", body.get("max_tokens"))
    out = int(most) if isinstance(most, int | float) and most > 0 else 0
    return content.estimate_tokens(req.prompt_text) + out


def _same_key(given: str | None, key: str) -> bool:
    """Compared in constant time: how long a refusal takes says nothing of the key."""
    # Header values arrive decoded as Latin-1: encoding them back gives the bytes sent.
    return given is not None and hmac.compare_digest(
        given.encode("latin-1", "replace"), key.encode("utf-8")
    )


def _is_dict(value: Any) -> bool:
    return isinstance(value, dict)


def _text(value: Any) -> str:
    """The text of a message content: a string, or a list of text parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(
            str(p.get("text", "")) for p in value if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _openai_answer(
    model: str, text: str, tokens: tuple[int, int], cache: tuple[int, int] = (0, 0)
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-sim-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": tokens[0],
            "completion_tokens": tokens[1],
            "total_tokens": tokens[0] + tokens[1],
            "prompt_tokens_details": {"cached_tokens": cache[0], "audio_tokens": 0},
        },
    }


def _anthropic_answer(
    model: str,
    req: _Request,
    text: str,
    tokens: tuple[int, int],
    cache: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    block: dict[str, Any]
    stop = "end_turn"
    if req.tool is not None:
        try:
            block = {
                "type": "tool_use",
                "id": f"toolu_sim_{uuid.uuid4().hex[:20]}",
                "name": req.tool,
                "input": json.loads(text),
            }
            stop = "tool_use"
        except ValueError:  # malformed: the "model" wrote text instead of calling the tool
            block = {"type": "text", "text": text}
    else:
        if req.prefill and text.startswith(req.prefill):
            text = text[len(req.prefill) :]
        block = {"type": "text", "text": text}
    return {
        "id": f"msg_sim_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": stop,
        "stop_sequence": None,
        # Anthropic counts the cached prefix apart from input_tokens.
        "usage": {
            "input_tokens": max(0, tokens[0] - cache[0] - cache[1]),
            "cache_creation_input_tokens": cache[1],
            "cache_read_input_tokens": cache[0],
            "output_tokens": tokens[1],
        },
    }


class Simulator:
    """The simulator in this process, on a thread: ``start()``, ``url``, ``close()``."""

    def __init__(
        self,
        config: SimConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        verbose: bool = False,
    ) -> None:
        self.state = SimState(config or SimConfig(), verbose)
        self._server = _Server((host, port), self.state)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        self._server.serve_forever(poll_interval=0.2)

    def start(self) -> Simulator:
        self._thread = threading.Thread(target=self.serve_forever, name="herd-sim", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
