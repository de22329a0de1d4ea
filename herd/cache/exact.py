"""The exact result cache: singleflight across processes, XFetch, stale-while-revalidate.

On a miss, one caller takes a fenced lock on the key and computes; the others
wait for the lock's release (a notification, with polling behind it) and read
the stored value, so a hundred workers asking for the same missing key cost one
model call. If the holder dies, its lock expires and one waiter takes over.
Errors are never cached: the next caller in line computes again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from herd import aio
from herd.cache.base import CacheStore, Entry
from herd.errors import LockNotAcquired, SingleflightTimeout, Snooze
from herd.jsonvalue import JSON
from herd.locks.base import BaseLocks
from herd.names import check_name

log = logging.getLogger("herd.cache")
# The miss a lookup adds to its outcome's count (no zero counters sent).
_MISS: dict[bool, dict[str, int]] = {False: {}, True: {"misses": 1}}

Source = Literal["hit", "waited", "computed", "stale", "early"]

# How long a computed value waits for the store to come back before it is given up: it
# may have cost a model call, and a store restarting or dropping its clients is back
# within seconds. Past this the caller's error stands and its next run computes again.
PUT_PATIENCE = 30.0


@dataclass(frozen=True)
class Lookup:
    value: JSON
    source: Source  # hit: stored; waited: another caller computed it; computed: we did;
    # stale: expired but served while one caller refreshes; early: refreshed by XFetch


class ExactCache:
    def __init__(
        self,
        store: CacheStore,
        locks: BaseLocks,
        *,
        namespace: str = "default",
        ttl: float | None = None,
        xfetch_beta: float | None = None,
        stale_while_revalidate: float = 0.0,
        lock_ttl: float = 60.0,
        wait: float = 900.0,
    ) -> None:
        """
        ttl: seconds an entry is fresh (None: forever, the default for evaluations).
        xfetch_beta: recompute early with probability rising toward expiry (Vattani et
            al. 2015); 1.0 is the paper's default, None turns it off.
        stale_while_revalidate: seconds after expiry during which the old value is
            served while one caller refreshes it in the background.
        lock_ttl: the singleflight lock's lease, renewed while the computation runs.
        wait: how long a caller waits for another's computation before giving up.
        """
        if xfetch_beta is not None and xfetch_beta <= 0:
            raise ValueError("xfetch_beta must be positive")
        check_name(namespace, "cache namespace", "namespace")
        self.store, self.locks, self.namespace = store, locks, namespace
        self.ttl, self.beta, self.swr = ttl, xfetch_beta, stale_while_revalidate
        self.lock_ttl, self.wait = lock_ttl, wait
        self._background: set[asyncio.Task[None]] = set()

    def _lock_name(self, key: str) -> str:
        return f"cache/{self.namespace}/{key}"

    async def get(self, key: str) -> JSON | None:
        entry = await self.store.get(self.namespace, key)
        return entry.value if entry is not None and entry.fresh else None

    async def put(self, key: str, value: JSON, *, delta: float = 0.0) -> None:
        await self.store.put(
            self.namespace, key, value, delta=delta, ttl=self.ttl, keep_stale=self.swr
        )

    async def invalidate(self, key: str) -> None:
        await self.store.delete(self.namespace, key)

    def _early(self, entry: Entry) -> bool:
        """XFetch: recompute before expiry with a probability that grows as it nears."""
        if self.beta is None or entry.expires_at is None:
            return False
        gap = -entry.delta * self.beta * math.log(1.0 - random.random())  # ln(U), U in (0, 1]
        return entry.now + gap >= entry.expires_at

    async def get_or_compute(
        self, key: str, compute: Callable[[], Awaitable[JSON]], *, owner: str | None = None
    ) -> Lookup:
        """The key's value: from the cache, else computed once across processes.

        ``owner`` names the piece of work that computes (a job): the key's lock held
        under the same owner, by an earlier run of that work that died, is taken over
        at once instead of waited out for its ttl (``Locks.hold``'s ``take_over``).
        """
        deadline = time.monotonic() + self.wait
        waited = False
        # A miss is counted with the lookup's outcome, in the same statement (a computed
        # value, an error, a wait for another's), not on its own when it is seen: one
        # write fewer per computed key. A compute handed back (Snooze) counts nothing.
        missed = False
        while True:
            entry = await self.store.get(self.namespace, key, stale_for=self.swr)
            if entry is not None and entry.fresh:
                if self._early(entry):
                    early = await self._compute(key, compute, "early", lookup_first=False)
                    if early is not None:
                        return early
                return await self._counted(
                    Lookup(entry.value, "waited" if waited else "hit"), missed
                )
            if entry is not None:  # expired, inside the stale-while-revalidate window
                self._refresh_in_background(key, compute)
                return await self._counted(Lookup(entry.value, "stale"), missed)
            missed = True
            done = await self._compute(
                key,
                compute,
                "computed",
                lookup_first=True,
                waited=waited,
                owner=owner,
                missed=True,
            )
            if done is not None:
                return done
            waited = True
            left = deadline - time.monotonic()
            if left <= 0:
                await self.store.count({"misses": 1}, self.namespace)
                raise SingleflightTimeout(
                    f"cache key {key[:16]}… is being computed elsewhere; gave up after"
                    f" {self.wait:g} s"
                )
            await self.locks.wait_released(self._lock_name(key), left)

    async def _compute(
        self,
        key: str,
        compute: Callable[[], Awaitable[JSON]],
        source: Source,
        *,
        lookup_first: bool,
        waited: bool = False,
        owner: str | None = None,
        missed: bool = False,
    ) -> Lookup | None:
        """Compute under the key's lock; None if another caller holds it. ``missed``:
        the caller's lookup missed, and the miss is counted here with the outcome
        (nothing when the compute is handed back)."""
        hold = self.locks.hold(
            self._lock_name(key), ttl=self.lock_ttl, owner=owner, take_over=owner is not None
        )
        try:
            async with hold:
                if lookup_first:  # it may have been stored while we were acquiring
                    entry = await self.store.get(self.namespace, key)
                    if entry is not None and entry.fresh:
                        return await self._counted(
                            Lookup(entry.value, "waited" if waited else "hit"), missed
                        )
                started = time.monotonic()
                try:
                    value = await compute()
                except Snooze:
                    # Handed back (a parked batch, a limit): not an error, and its next
                    # run looks again, so this lookup's miss is not counted.
                    raise
                except Exception:
                    await self.store.count({"errors": 1, **_MISS[missed]}, self.namespace)
                    raise
                delta = time.monotonic() - started
                await aio.through_outage(
                    partial(self.put, key, value, delta=delta), f"cache key {key[:16]}…",
                    patience=PUT_PATIENCE,
                )  # fmt: skip
                return await self._counted(Lookup(value, source), missed)
        except LockNotAcquired:
            return None

    async def _counted(self, lookup: Lookup, missed: bool = False) -> Lookup:
        name = {
            "hit": "hits",
            "waited": "waited",
            "computed": "computed",
            "stale": "stale",
            "early": "early_refresh",
        }[lookup.source]
        await self.store.count({name: 1, **_MISS[missed]}, self.namespace)
        return lookup

    def _refresh_in_background(self, key: str, compute: Callable[[], Awaitable[JSON]]) -> None:
        async def refresh() -> None:
            try:
                await self._compute(key, compute, "computed", lookup_first=True)
            except Exception as exc:  # the stale value was served; the next caller retries
                log.warning("background refresh of cache key %s… failed: %s", key[:16], exc)

        task = asyncio.create_task(refresh(), name=f"herd-cache-refresh-{key[:12]}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Wait for background refreshes (for orderly shutdown and tests)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
