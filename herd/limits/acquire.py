"""Waiting for capacity: one gate per (limiter, scope) in a process, and ``hold()``.

64 coroutines of a worker waiting on one limit queue on the gate (FIFO); only its
head asks the store (one gate per flow of a fair share: a batch refused for its share
must not keep another batch's calls from asking), sleeping the Grant's wait (plus a
little jitter, so that the heads of several processes do not all come back in one
instant) between tries.
The client's clock only ever decides when to ask again and when to give up, never
whether capacity is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field

from herd import aio
from herd.errors import CapacityTimeout, HerdError
from herd.limits.base import Grant, Limit, Limiter, Share

log = logging.getLogger("herd.limits")

# How often a head re-asks while waiting on a concurrency slot: a release elsewhere
# in the fleet is not announced, and the Grant's wait (the oldest slot's expiry) is
# only the latest it can come.
SLOT_POLL = 0.05
# Added to each wait: enough to spread the heads of several processes apart, small
# enough not to leave capacity idle (a head that comes back 5% late uses 95%).
JITTER = (0.0005, 0.003)


@dataclass
class _Gate:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    last_wait: float = 0.0
    turn: int = 0  # the option a pool's head asks first (the one after the last granted)


# Per event loop, per limiter object (weakly: a closed limiter's gates go with it).
_GATES: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, weakref.WeakKeyDictionary[object, dict[str, _Gate]]
] = weakref.WeakKeyDictionary()


def _gate(limiter: Limiter, scope: str, share: Share | None) -> _Gate:
    per_loop = _GATES.setdefault(asyncio.get_running_loop(), weakref.WeakKeyDictionary())
    gates = per_loop.setdefault(limiter, {})
    name = scope if share is None else f"{scope}\n{share.flow}"
    gate = gates.get(name)
    if gate is None:
        gate = gates[name] = _Gate()
    return gate


@dataclass
class Slot:
    """Capacity held for one call. ``adjust(actual)`` charges actual - reserved."""

    limiter: Limiter
    scope: str
    limit: Limit
    holder: str
    reserved: int
    waited: float  # seconds this acquire waited
    at: float  # the store's clock when granted
    adjusted: bool = False

    async def adjust(self, actual_tokens: int) -> None:
        """Reconcile with the usage the provider reported (once; later calls are ignored)."""
        if self.adjusted:
            return
        self.adjusted = True
        delta = int(actual_tokens) - self.reserved
        if delta:
            await self.limiter.adjust(self.scope, self.limit, delta)


async def _acquire(
    limiter: Limiter,
    options: Sequence[tuple[str, Limit]],
    tokens: int,
    holder: str,
    hold_for: float,
    max_wait: float,
    share: Share | None,
) -> tuple[Slot, float]:
    """The first of ``options`` (scope, limit) with room, asked in turn from the one
    after the gate's last grant: a pool's keys take the calls in turn while each has
    room, and the others' while one is full or paused. Every ask is the store's atomic
    try_acquire, so the pick is fleet-wide; the head waits the shortest of their waits."""
    scopes = [scope for scope, _ in options]
    name = scopes[0] if len(scopes) == 1 else f"pool of {len(scopes)}: {', '.join(scopes)}"
    gate = _gate(limiter, "\n".join(scopes), share)
    started = time.monotonic()
    deadline = started + max_wait

    def timeout(reason: str, retry_in: float) -> CapacityTimeout:
        return CapacityTimeout(
            f"no capacity under the limit of {name} ({reason}) within {max_wait:g} s;"
            f" retry in {retry_in:.2f} s",
            scope=scopes[0],
            reason=reason,
            retry_in=retry_in,
        )

    try:
        async with asyncio.timeout(max(0.0, max_wait)):
            await gate.lock.acquire()
    except TimeoutError:
        raise timeout("queued behind other requests", gate.last_wait) from None
    try:
        while True:
            gate.released.clear()
            refusals: list[Grant] = []
            for n in range(len(options)):
                scope, limit = options[(gate.turn + n) % len(options)]
                grant = await limiter.try_acquire(scope, limit, tokens, holder, hold_for, share)
                if grant.granted:
                    gate.turn = (gate.turn + n + 1) % len(options)
                    gate.last_wait = 0.0
                    waited = time.monotonic() - started
                    slot = Slot(limiter, scope, limit, holder, tokens, waited, grant.at)
                    return slot, waited
                refusals.append(grant)
            grant = min(refusals, key=lambda g: g.wait)
            gate.last_wait = grant.wait
            left = deadline - time.monotonic()
            # A slot may be released before the estimate; the others cannot come sooner.
            if grant.reason != "concurrency" and grant.wait > left:
                raise timeout(grant.reason or "limit", grant.wait)
            if left <= 0:
                raise timeout(grant.reason or "limit", grant.wait)
            nap = grant.wait + random.uniform(*JITTER)
            if grant.reason == "concurrency":
                nap = min(nap, SLOT_POLL * random.uniform(0.5, 1.5))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(nap, left)):
                    await gate.released.wait()
    finally:
        gate.lock.release()


def hold(
    limiter: Limiter,
    scope: str,
    limit: Limit,
    tokens: int,
    *,
    holder: str,
    hold_for: float = 120.0,
    max_wait: float = 30.0,
    share: Share | None = None,
) -> AbstractAsyncContextManager[Slot]:
    """Wait for capacity (raising CapacityTimeout past max_wait, nothing taken), hold it
    for the call (renewing the concurrency slot every hold_for/3 in a background task),
    release the slot on exit, whatever happens. Slot.adjust(actual_tokens) reconciles
    (charges actual - reserved); Slot.waited: seconds this acquire waited. ``share``:
    the call's flow and weight for the scope's fair share (herd.limits.base.Share)."""
    return hold_any(
        limiter, [(scope, limit)], tokens, holder=holder, hold_for=hold_for,
        max_wait=max_wait, share=share,
    )  # fmt: skip


@asynccontextmanager
async def hold_any(
    limiter: Limiter,
    options: Sequence[tuple[str, Limit]],
    tokens: int,
    *,
    holder: str,
    hold_for: float = 120.0,
    max_wait: float = 30.0,
    share: Share | None = None,
) -> AsyncIterator[Slot]:
    """``hold()`` over the first of several scopes with room (a key pool's: one scope
    per key, each with its own limit); ``Slot.scope`` is the one granted."""
    if not options:
        raise ValueError("hold_any needs at least one scope")
    slot, waited = await _acquire(limiter, options, tokens, holder, hold_for, max_wait, share)
    scope, limit = slot.scope, slot.limit
    if waited > 0.001:
        with contextlib.suppress(HerdError):
            await limiter.note_wait(scope, waited)
    renewer = None
    if limit.max_concurrent:
        renewer = asyncio.create_task(
            _renew(limiter, scope, holder, hold_for), name=f"herd-limit-renew:{scope}"
        )
    try:
        yield slot
    finally:
        await aio.stop(renewer)
        if limit.max_concurrent:
            # Shielded: a cancelled call must not strand its slot for hold_for.
            with contextlib.suppress(HerdError):
                await asyncio.shield(limiter.release(scope, holder))
            _gate(limiter, "\n".join(s for s, _ in options), share).released.set()


async def _renew(limiter: Limiter, scope: str, holder: str, hold_for: float) -> None:
    while True:
        await asyncio.sleep(hold_for / 3)
        try:
            if not await limiter.renew(scope, holder, hold_for):
                # The slot expired (a blocked loop): the call goes on, counted no more.
                log.warning("concurrency slot of %s expired before its call ended", scope)
                return
        except HerdError as exc:
            log.debug("could not renew the slot of %s (%s); trying again", scope, exc)
