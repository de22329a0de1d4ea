"""Provider limits: what a limit is, the store protocol, and the GCRA both backends share.

Each dimension (requests, tokens) is a GCRA kept as one number, its theoretical
arrival time ``tat`` (epoch seconds, the store's clock). With limit ``L`` per
period ``P``, a burst ``B = L/20`` and a rate ``r = (L - B)/P``, a cost ``n`` is
granted at store time ``t`` when ``r * (tat - t) + n <= B``, and then
``tat = max(tat, t) + n/r``. ``tat`` is not clamped to ``t`` in the check: an idle
bucket's credit lets a cost larger than the burst through once the bucket has
been empty for ``(n - B)/r`` s. Any window of one period then admits at most
``B + r*P = L`` (the credit a large cost uses up is exactly the drain it waited
for), and steady use is ``(L - B)/L = 95%`` of the limit. A cost above ``L``
could never pass and is refused at once (InvalidInput).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from herd.errors import CapacityTimeout, InvalidInput

__all__ = [
    "BURST_FRACTION",
    "LIMIT_TTL",
    "MAX_PAUSE",
    "CapacityTimeout",
    "Grant",
    "Limit",
    "LimitStats",
    "Limiter",
    "Rate",
    "key_id",
    "pause_seconds",
    "batch_scope",
    "scope_name",
]

BURST_FRACTION = 0.05
# A scope unused for this long is forgotten (its Redis keys expire, its row is purged).
LIMIT_TTL = 86400
MAX_SCOPE_BYTES = 1024
# The longest a provider's word pauses a limit or a job: a longer Retry-After or reset is
# more likely a broken proxy than a real one, and waiting it out would stall (or, past
# what Snooze takes, dead-letter) every job of the scope. After it, one call asks again.
MAX_PAUSE = 3600.0
_FIELDS = ("rpm", "tpm", "max_concurrent")


@dataclass(frozen=True)
class Limit:
    rpm: int | None = None  # requests per period
    tpm: int | None = None  # tokens (input + expected output) per period
    max_concurrent: int | None = None  # requests in flight at once
    period: float = 60.0  # seconds; tests use 1.0 so a test runs in seconds

    def stricter(self, other: Limit) -> Limit:
        """Field-wise the smaller of what either sets, per ``self.period`` (the other's
        counts scaled down to it when the periods differ)."""
        scale = self.period / other.period

        def pick(mine: int | None, theirs: int | None, scaled: bool) -> int | None:
            if theirs is not None and scaled:
                theirs = max(1, math.floor(theirs * scale))
            if mine is None:
                return theirs
            return mine if theirs is None else min(mine, theirs)

        return Limit(
            rpm=pick(self.rpm, other.rpm, True),
            tpm=pick(self.tpm, other.tpm, True),
            max_concurrent=pick(self.max_concurrent, other.max_concurrent, False),
            period=self.period,
        )

    def __bool__(self) -> bool:
        return any(getattr(self, f) is not None for f in _FIELDS)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f: getattr(self, f) for f in _FIELDS if getattr(self, f)}
        out["period"] = self.period
        return out

    @classmethod
    def from_json(cls, d: Any, *, where: str = "limit") -> Limit:
        if not isinstance(d, Mapping):
            raise InvalidInput(f"{where}: must be an object", field=where)
        unknown = sorted(set(d) - {*_FIELDS, "period"})
        if unknown:
            raise InvalidInput(
                f"{where}.{unknown[0]}: unknown field; expected rpm, tpm, max_concurrent, period",
                field=f"{where}.{unknown[0]}",
            )
        values: dict[str, Any] = {}
        for f in _FIELDS:
            v = d.get(f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InvalidInput(
                    f"{where}.{f}: must be a positive integer, not {v!r:.40}", field=f"{where}.{f}"
                )
            values[f] = v
        period = d.get("period", 60.0)
        if (
            isinstance(period, bool)
            or not isinstance(period, int | float)
            or not math.isfinite(period)
            or period <= 0
        ):
            raise InvalidInput(
                f"{where}.period: must be a positive number of seconds, not {period!r:.40}",
                field=f"{where}.period",
            )
        return cls(**values, period=float(period))


@dataclass(frozen=True)
class Rate:
    """One GCRA dimension as the stores take it: a burst (units) and a rate (units/s)."""

    burst: float
    rate: float

    @classmethod
    def of(cls, limit: int | None, period: float) -> Rate | None:
        if limit is None:
            return None
        burst = limit * BURST_FRACTION
        return cls(burst, (limit - burst) / period)


def rates(limit: Limit) -> tuple[Rate | None, Rate | None]:
    return Rate.of(limit.rpm, limit.period), Rate.of(limit.tpm, limit.period)


def content(tat: float, now: float, rate: Rate | None) -> float:
    """Units counted in the bucket now: what the current period has used."""
    return 0.0 if rate is None else max(0.0, (tat - now) * rate.rate)


def key_id(api_key: str | None) -> str:
    """An API key's id: a hash prefix, never the key."""
    if api_key is None:
        return "nokey"
    return "k" + hashlib.sha256(api_key.encode()).hexdigest()[:10]


def scope_name(provider: str, model: str, key: str) -> str:
    return f"{provider}:{model}:{key}"


# The longest batch name a batch's scope carries as it is; a longer one, or one with a
# brace (a Redis hash tag), is carried as a hash of it.
BATCH_NAME_BYTES = 200


def batch_scope(batch: str, provider: str, model: str) -> str:
    """The scope of one batch's own limit (its --rpm, --tpm, --max-concurrent) on a
    provider's model: a scope of its own, taken in addition to the fleet's, so that a
    batch's limit never becomes the limit, or the rate state, of every batch on the key."""
    plain = len(batch.encode()) <= BATCH_NAME_BYTES and not any(c in batch for c in "{}#")
    name = batch if plain else "#" + hashlib.sha256(batch.encode()).hexdigest()[:16]
    return f"batch:{name}:{provider}:{model}"


def check_request(scope: str, limit: Limit, tokens: int, hold_for: float) -> None:
    """Refuse what no store could ever grant, before asking one."""
    check_scope(scope)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise InvalidInput(f"tokens must be a whole number, not {tokens!r}", field="tokens")
    if limit.tpm is not None and tokens > limit.tpm:
        raise InvalidInput(
            f"a request of {tokens} tokens can never pass the limit of {limit.tpm} tokens"
            f" per {limit.period:g} s of {scope}",
            field="tokens",
        )
    if not (math.isfinite(hold_for) and hold_for > 0):
        raise InvalidInput(f"hold_for must be a positive number of seconds, not {hold_for!r}")


def pause_seconds(seconds: float) -> float:
    """``seconds`` as a pause, within [0, MAX_PAUSE]: the one place every pause or wait a
    provider asks for (Retry-After, a reset header, a limiter's pause) is bounded.
    InvalidInput when it is not a finite number (``inf``, ``nan``)."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
    ):
        raise InvalidInput(
            f"a pause must be a finite number of seconds, not {seconds!r:.40}", field="seconds"
        )
    return min(MAX_PAUSE, max(0.0, float(seconds)))


def check_scope(scope: str) -> None:
    if not scope or len(scope.encode()) > MAX_SCOPE_BYTES or "{" in scope or "}" in scope:
        raise InvalidInput(
            f"a limit scope must have 1 to {MAX_SCOPE_BYTES} bytes and no braces,"
            f" not {scope!r:.80}",
            field="scope",
        )


@dataclass(frozen=True)
class Grant:
    granted: bool
    wait: float  # seconds until trying again may succeed (0 when granted)
    at: float  # the store's clock, epoch seconds, when decided
    reason: str | None  # when refused: "requests" | "tokens" | "concurrency" | "paused"


@dataclass(frozen=True)
class LimitStats:
    scope: str
    limit: Limit  # the limit last acquired under
    requests: int  # granted since the row/key was made
    tokens: int  # tokens charged (reservations + adjustments)
    in_flight: int  # concurrency slots held now (expired ones not counted)
    requests_now: float  # requests counted in the current period (from the GCRA state)
    tokens_now: float  # tokens counted in the current period
    waits: int  # wait episodes (acquire() calls that had to wait)
    wait_seconds: float  # total seconds waited
    rate_limited: int  # 429s reported through pause()
    paused_until: float | None  # epoch seconds, None when not paused


def stats_of(
    scope: str,
    lim: Any,
    now: float,
    *,
    req_tat: float,
    tok_tat: float,
    in_flight: int,
    requests: int,
    tokens: int,
    waits: int,
    wait_seconds: float,
    rate_limited: int,
    paused_until: float | None,
) -> LimitStats:
    """A store's raw state, read at store time ``now``, as LimitStats."""
    try:
        limit = Limit.from_json(lim or {})
    except InvalidInput:
        limit = Limit()
    req, tok = rates(limit)
    return LimitStats(
        scope=scope,
        limit=limit,
        requests=requests,
        tokens=tokens,
        in_flight=in_flight,
        requests_now=content(req_tat, now, req),
        tokens_now=content(tok_tat, now, tok),
        waits=waits,
        wait_seconds=wait_seconds,
        rate_limited=rate_limited,
        paused_until=paused_until if paused_until is not None and paused_until > now else None,
    )


class Limiter(Protocol):
    """Fleet-wide provider limits in the job store; ``PostgresLimiter``, ``RedisLimiter``."""

    name: str  # its key in herd.limits.registry.LIMITERS
    url: str  # where it lives: another process opens it with for_broker(name, url)

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def try_acquire(
        self, scope: str, limit: Limit, tokens: int, holder: str, hold_for: float
    ) -> Grant:
        """Atomically take one request, ``tokens`` tokens and (if max_concurrent) a
        concurrency slot held by ``holder`` for ``hold_for`` s unless released or renewed
        — or nothing. One round trip; the store's clock only (Redis TIME, PG now())."""
        ...

    async def renew(self, scope: str, holder: str, hold_for: float) -> bool: ...

    async def release(self, scope: str, holder: str) -> None: ...

    async def adjust(self, scope: str, limit: Limit, tokens: int) -> None:
        """After the call: charge (+) or refund (-) reported usage minus the reservation."""
        ...

    async def pause(self, scope: str, seconds: float) -> None:
        """A provider's 429: every try_acquire of scope is refused (reason "paused") until
        max(current pause, now + seconds); counts one rate_limited."""
        ...

    async def note_wait(self, scope: str, seconds: float) -> None:
        """One wait episode of ``seconds``: waits += 1, wait_seconds += seconds."""
        ...

    async def stats(self, scopes: Sequence[str] | None = None) -> list[LimitStats]:
        """Per scope (None: every scope the store keeps, O(limits), not history)."""
        ...
