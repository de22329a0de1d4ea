"""The simulator's own rate limits: requests and tokens per minute, as the providers enforce them.

OpenAI and Anthropic both describe their per-minute limits as capacity that is
replenished continuously rather than reset at the top of each minute (a token bucket):
the bucket holds at most the per-minute limit and refills at limit / 60 per second, so a
fresh key may burst up to its whole limit and then runs at the limit's rate.

One pair of buckets (requests, tokens) per API key and model, the key known only by a
hash-derived id. What a request costs is charged when it is admitted:

* requests: 1;
* tokens: the input (``content.estimate_tokens`` of the prompt) plus the most output the
  request allows (``max_completion_tokens`` or ``max_tokens``, 0 when neither is given).
  OpenAI documents that its limiter counts ``max_tokens`` up front, whatever the answer
  turns out to be; Anthropic estimates output from ``max_tokens`` at the start too. The
  simulator gives nothing back after the answer, OpenAI's rule: a limiter that reserves
  input + max output per call is then exactly right.

A request that does not fit is refused (429) and charged nothing. The refusal tells how
long until it would fit (``retry-after``); every answer carries each dimension's limit,
what remains, and how long until its bucket is full again (what both providers call the
reset).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

MAX_BUCKETS = 10_000  # (key, model) pairs kept; the least recently used goes first


@dataclass
class Bucket:
    """Capacity ``limit``, refilled at ``limit / 60`` per second; ``level`` may not go below 0."""

    limit: int
    level: float
    at: float

    @property
    def rate(self) -> float:
        return self.limit / 60.0

    def refill(self, now: float) -> None:
        self.level = min(float(self.limit), self.level + (now - self.at) * self.rate)
        self.at = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` fits (inf when it never can)."""
        if amount > self.limit:
            return math.inf
        return max(0.0, (amount - self.level) / self.rate)

    def until_full(self) -> float:
        return max(0.0, (self.limit - self.level) / self.rate)


@dataclass(frozen=True)
class Dimension:
    """One limit as the headers report it after a request was weighed."""

    name: str  # "requests" | "tokens"
    limit: int
    remaining: int
    reset: float  # seconds until the bucket is full again


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    dimensions: tuple[Dimension, ...]
    retry_after: float | None = None  # seconds, when refused
    scope: str | None = None  # the dimension that refused
    requested: int = 0  # tokens the request was weighed at


class RateLimits:
    """Buckets per (key id, model). Not thread-safe: the caller holds the state's lock."""

    def __init__(
        self, rpm: int | None, tpm: int | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self._clock = clock
        self._buckets: OrderedDict[tuple[str, str], dict[str, Bucket]] = OrderedDict()

    @property
    def active(self) -> bool:
        return bool(self.rpm or self.tpm)

    def _pair(
        self, key_id: str, model: str, now: float, rpm: int | None, tpm: int | None
    ) -> dict[str, Bucket]:
        pair = self._buckets.get((key_id, model))
        if pair is None:
            pair = {}
            if rpm:
                pair["requests"] = Bucket(rpm, float(rpm), now)
            if tpm:
                pair["tokens"] = Bucket(tpm, float(tpm), now)
            self._buckets[(key_id, model)] = pair
            while len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end((key_id, model))
        for bucket in pair.values():
            bucket.refill(now)
        return pair

    def admit(
        self,
        key_id: str,
        model: str,
        tokens: int,
        *,
        rpm: int | None = None,
        tpm: int | None = None,
    ) -> Verdict:
        """Charge one request of ``tokens`` if both buckets hold enough, else refuse it.
        ``rpm``/``tpm``: this key's own sizes (spells.KeyRule), over the simulator's."""
        now = self._clock()
        pair = self._pair(key_id, model, now, rpm or self.rpm, tpm or self.tpm)
        cost = {"requests": 1.0, "tokens": float(tokens)}
        waits = {name: b.wait_for(cost[name]) for name, b in pair.items()}
        short = {name: w for name, w in waits.items() if w > 0}
        if short:
            scope = max(short, key=lambda n: short[n])
            wait = short[scope]
            retry_after = wait if math.isfinite(wait) else pair[scope].until_full() or 60.0
            return Verdict(False, self._report(pair), retry_after, scope, tokens)
        for name, bucket in pair.items():
            bucket.level -= cost[name]
        return Verdict(True, self._report(pair), requested=tokens)

    @staticmethod
    def _report(pair: dict[str, Bucket]) -> tuple[Dimension, ...]:
        return tuple(
            Dimension(name, b.limit, max(0, math.floor(b.level)), b.until_full())
            for name, b in pair.items()
        )


def key_id(api_key: str | None) -> str:
    """A stable id of a key that says nothing of it: the key itself is never kept."""
    if not api_key:
        return "-"
    return hashlib.sha256(api_key.encode("utf-8", "replace")).hexdigest()[:16]


def go_duration(seconds: float) -> str:
    """OpenAI's reset format, Go's duration strings: ``120ms``, ``1s``, ``1.5s``, ``6m0s``."""
    if seconds < 1.0:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    hours, rest = divmod(seconds, 3600.0)
    minutes, secs = divmod(rest, 60.0)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours >= 1:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes >= 1:
        return f"{int(minutes)}m{text}"
    return text


def rfc3339(seconds_from_now: float, now: datetime | None = None) -> str:
    """Anthropic's reset format: the UTC instant the bucket is full, to the second."""
    when = (now or datetime.now(UTC)) + timedelta(seconds=seconds_from_now)
    when = when.replace(microsecond=0) + timedelta(seconds=1 if when.microsecond else 0)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def headers_for(api: str, verdict: Verdict, retry_after: bool = True) -> dict[str, str]:
    """The rate-limit headers of ``api``'s wire format (``openai`` | ``anthropic``)."""
    headers: dict[str, str] = {}
    if api == "openai":
        for d in verdict.dimensions:
            headers[f"x-ratelimit-limit-{d.name}"] = str(d.limit)
            headers[f"x-ratelimit-remaining-{d.name}"] = str(d.remaining)
            headers[f"x-ratelimit-reset-{d.name}"] = go_duration(d.reset)
    else:
        now = datetime.now(UTC)
        for d in verdict.dimensions:
            # One token limit over input and output: Anthropic's input- and output-token
            # headers report that same limit, as tokens-* reports the tightest in force.
            names = (
                ["requests"]
                if d.name == "requests"
                else ["tokens", "input-tokens", "output-tokens"]
            )
            for name in names:
                headers[f"anthropic-ratelimit-{name}-limit"] = str(d.limit)
                headers[f"anthropic-ratelimit-{name}-remaining"] = str(d.remaining)
                headers[f"anthropic-ratelimit-{name}-reset"] = rfc3339(d.reset, now)
    if retry_after and not verdict.admitted and verdict.retry_after is not None:
        headers["retry-after"] = str(max(1, math.ceil(verdict.retry_after)))
        if api == "openai":
            # The openai SDK reads this one first: the wait to the millisecond.
            headers["retry-after-ms"] = str(max(1, math.ceil(verdict.retry_after * 1000)))
    return headers
