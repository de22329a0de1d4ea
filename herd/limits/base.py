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
    "Share",
    "FlowShare",
    "key_id",
    "pause_seconds",
    "pooled",
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

# Fair shares (``Share``): the flows (batches) of a scope are compared by their use over a
# recent window, decayed exponentially with this time constant: a period's sixth, within
# [SHARE_WINDOW_MIN, SHARE_WINDOW_MAX] s. Short enough that a share is about now, not
# about the minute before a batch came; long enough to hold tens of requests at rpm 600.
SHARE_WINDOW_MIN = 0.5
SHARE_WINDOW_MAX = 10.0
# A flow refused is waiting until the time it was told to come back, plus this: a flow
# that does not come back by then stops holding capacity for itself. Generous, because a
# worker's event loop under load comes back late, and a late head would lose its turn.
SHARE_GRACE = 1.0
# A flow granted stays waiting this long at most: its next call asks at once if it has
# one (and is refused, so waiting again); a batch that has ended holds nothing for long.
SHARE_LINGER = 0.1
# How soon a flow refused for its share asks again (a grant goes to the other flow first).
SHARE_TICK = 0.05
# A flow not seen for this long is dropped from its scope's state.
SHARE_FORGET = 120.0
MAX_WEIGHT = 1000


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


def pooled(limits: Sequence[Limit]) -> Limit:
    """What several keys' limits allow together (a key pool: each key has its own), per
    the first one's period: each field added up, None (unlimited) where a key sets none."""
    first = limits[0]

    def total(name: str, scaled: bool) -> int | None:
        values: list[int] = []
        for lim in limits:
            v: int | None = getattr(lim, name)
            if v is None:
                return None
            values.append(max(1, math.floor(v * first.period / lim.period)) if scaled else v)
        return sum(values)

    return Limit(rpm=total("rpm", True), tpm=total("tpm", True),
                 max_concurrent=total("max_concurrent", False), period=first.period)  # fmt: skip


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


@dataclass(frozen=True)
class Share:
    """Whose call this is, for the fair share of a scope: a flow (a batch) and its weight.

    Flows that share a scope get its requests and tokens in proportion to their weights,
    work-conserving: a flow is refused (reason "share") only while another flow of the
    scope is waiting (it was refused, and its time to ask again has not passed) and has
    used less of the window for its weight than this one would with this call."""

    flow: str
    weight: float = 1.0

    def __post_init__(self) -> None:
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, int | float) or not 0 < w <= MAX_WEIGHT:
            raise InvalidInput(
                f"a weight must be a number in (0, {MAX_WEIGHT}], not {w!r:.40}", field="weight"
            )
        if not self.flow or len(self.flow.encode()) > MAX_SCOPE_BYTES:
            raise InvalidInput("a share's flow must have 1 to 1024 bytes", field="flow")


@dataclass(frozen=True)
class FlowShare:
    """One flow of a scope as stats() reads it."""

    flow: str
    weight: float
    used: float  # its use over the window, in fractions of the limit (decayed)
    share: float  # its part of what the scope's active flows used over the window, 0..1
    fair: float  # its weight over the active flows' weights, 0..1
    waiting: bool  # refused, and its time to ask again has not passed


def share_window(period: float) -> float:
    return min(SHARE_WINDOW_MAX, max(SHARE_WINDOW_MIN, period / 6))


def share_cost(limit: Limit, tokens: int) -> float:
    """What one call uses of a scope, for fair shares: the larger of its request and its
    tokens as fractions of their limits (1 where neither is limited)."""
    parts = [1 / limit.rpm if limit.rpm else 0.0, tokens / limit.tpm if limit.tpm else 0.0]
    return max(parts) if any(parts) else 1.0


def shares_of(
    flows: Any, flows_at: float | None, now: float, period: float
) -> tuple[FlowShare, ...]:
    """A store's flow state (flow -> {w, u, s, x}, decayed last at ``flows_at``) at ``now``:
    the flows seen within the window, with their share of it."""
    if not isinstance(flows, Mapping) or not flows:
        return ()
    window = share_window(period)
    decay = math.exp(-max(0.0, now - (flows_at or now)) / window)
    active = {
        name: f for name, f in flows.items()
        if isinstance(f, Mapping) and now - float(f.get("s", 0)) <= window
    }  # fmt: skip
    used = {name: float(f.get("u", 0)) * decay for name, f in active.items()}
    total_used = sum(used.values())
    total_weight = sum(float(f.get("w", 1)) for f in active.values())
    return tuple(
        FlowShare(
            flow=name,
            weight=float(f.get("w", 1)),
            used=used[name],
            share=used[name] / total_used if total_used else 0.0,
            fair=float(f.get("w", 1)) / total_weight if total_weight else 0.0,
            waiting=float(f.get("x", 0)) >= now,
        )
        for name, f in sorted(active.items())
    )


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
    # when refused: "requests" | "tokens" | "concurrency" | "paused" | "share"
    reason: str | None


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
    shares: tuple[FlowShare, ...] = ()  # the flows seen within the share window


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
    flows: Any = None,
    flows_at: float | None = None,
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
        shares=shares_of(flows, flows_at, now, limit.period),
    )


class Limiter(Protocol):
    """Fleet-wide provider limits in the job store; ``PostgresLimiter``, ``RedisLimiter``."""

    name: str  # its key in herd.limits.registry.LIMITERS
    url: str  # where it lives: another process opens it with for_broker(name, url)

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def try_acquire(
        self,
        scope: str,
        limit: Limit,
        tokens: int,
        holder: str,
        hold_for: float,
        share: Share | None = None,
    ) -> Grant:
        """Atomically take one request, ``tokens`` tokens and (if max_concurrent) a
        concurrency slot held by ``holder`` for ``hold_for`` s unless released or renewed
        — or nothing. One round trip; the store's clock only (Redis TIME, PG now()).
        With a ``share``, the call is its flow's: refused (reason "share") while another
        flow of the scope waits and is further below its weighted share (see Share)."""
        ...

    async def renew(self, scope: str, holder: str, hold_for: float) -> bool: ...

    async def release(self, scope: str, holder: str) -> None: ...

    async def adjust(self, scope: str, limit: Limit, tokens: int) -> None:
        """After the call: charge (+) or refund (-) reported usage minus the reservation."""
        ...

    async def pause(self, scope: str, seconds: float, *, rate_limited: bool = True) -> None:
        """A provider's 429: every try_acquire of scope is refused (reason "paused") until
        max(current pause, now + seconds); counts one rate_limited. A key the provider
        refused (401, 403) is paused the same way, not counted (``rate_limited=False``):
        the limits table's 429s are the provider's, not a wrong key's."""
        ...

    async def note_wait(self, scope: str, seconds: float) -> None:
        """One wait episode of ``seconds``: waits += 1, wait_seconds += seconds."""
        ...

    async def stats(self, scopes: Sequence[str] | None = None) -> list[LimitStats]:
        """Per scope (None: every scope the store keeps, O(limits), not history)."""
        ...


@dataclass(frozen=True)
class ShareArgs:
    """What a store's acquire takes of a Share: the flow, its weight, this call's cost and
    the window (both stores run the same arithmetic, herd/limits/sql/5002 and redis.py)."""

    flow: str | None
    weight: float
    cost: float
    window: float
    grace: float = SHARE_GRACE
    linger: float = SHARE_LINGER
    tick: float = SHARE_TICK
    forget: float = SHARE_FORGET

    @classmethod
    def of(cls, share: Share | None, limit: Limit, tokens: int) -> ShareArgs:
        if share is None:
            return cls(None, 1.0, 0.0, share_window(limit.period))
        return cls(
            share.flow, float(share.weight), share_cost(limit, tokens), share_window(limit.period)
        )
