"""Contract: a key pool's scopes, each with its own limit, held through ``hold_any`` by
several processes (limiters of their own) on every backend: calls go to a scope with
room, every scope keeps its own limit, and a pause stops its own scope only.

Times compared are the store's (Slot.at), never the test's clock.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

from herd.limits import Limit, for_broker, hold_any
from tests.contract.test_limits import max_in_window

N = 10  # requests per period per key


def pool_of(n: int) -> list[tuple[str, Limit]]:
    tag = uuid.uuid4().hex[:8]
    return [(f"pool-{tag}:m:k{i}", Limit(rpm=N, period=1.0)) for i in range(n)]


async def test_a_pool_of_two_keys_serves_twice_one_key_and_each_keeps_its_limit(limiter):
    options = pool_of(2)
    other = for_broker(limiter.name, limiter.url)  # a second process's limiter
    await other.open()
    grants: list[tuple[str, float]] = []

    async def caller(lim, n: int) -> None:  # type: ignore[no-untyped-def]
        for _ in range(n):
            holder = uuid.uuid4().hex
            async with hold_any(lim, options, 1, holder=holder, max_wait=30) as slot:
                grants.append((slot.scope, slot.at))

    try:
        await asyncio.gather(*(caller(lim, 8) for lim in (limiter, other) for _ in range(4)))
    finally:
        await other.close()
    by_scope = Counter(scope for scope, _ in grants)
    assert set(by_scope) == {s for s, _ in options} and sum(by_scope.values()) == 64
    # Each key its own limit (the GCRA's bound: at most N in any window of a period)...
    for scope, _ in options:
        assert max_in_window([[at, 1] for s, at in grants if s == scope], 1.0) <= N
    # ...and the pool more than one key could give: both keys in the same windows.
    assert max_in_window([[at, 1] for _, at in grants], 1.0) > N
    # Taken in turn while both have room: neither key carries the pool.
    assert min(by_scope.values()) >= 64 * 0.3, by_scope


async def test_a_paused_key_is_passed_over_and_the_others_are_not_paused(limiter):
    options = pool_of(2)
    (paused, _), (free, _) = options
    await limiter.pause(paused, 30.0)
    scopes = []
    for _ in range(6):
        async with hold_any(limiter, options, 1, holder=uuid.uuid4().hex, max_wait=5) as slot:
            scopes.append(slot.scope)
    assert scopes == [free] * 6
    stats = {s.scope: s for s in await limiter.stats([paused, free])}
    assert stats[paused].requests == 0 and stats[paused].rate_limited == 1
    assert stats[free].paused_until is None and stats[free].rate_limited == 0
