"""Celery tasks that pay for a model call once: ``once(key, compute)`` in the task body.

    from herd.integrations.celery import once

    @celery_app.task(acks_late=True, reject_on_worker_lost=True)
    def summarize(doc: str) -> dict:
        return once({"task": "summarize", "model": MODEL, "doc": doc}, lambda: call_model(doc))

``once`` is herd's exact cache with its cross-process singleflight, blocking: the key
(any JSON value; SHA-256 over its canonical form) is looked up; on a miss one caller,
in any worker process of any machine, takes the key's fenced lock and runs
``compute`` while the others wait for its answer, and the answer (JSON) is stored
before the lock goes. So a task delivered twice (Celery redelivers an unacknowledged
message when its worker dies, or after the visibility timeout while it still runs)
and twenty tasks carrying five distinct prompts make five model calls. A holder that
dies lets its lock expire after HERD_EVAL_LOCK_TTL, and one waiter calls again: a
SIGKILL mid-call costs at most that one call more.

What Celery still cannot give, and herd's own queue does: the task's own result is
not fenced (a redelivered task whose first delivery still runs may write twice, and
Celery acknowledges whichever finishes), a task killed again and again is redelivered
forever (no stall count, no dead letter), and a visibility timeout shorter than the
call runs it twice at once (the lock keeps that to one model call, not one task).
Move the work to herd's queue when any of those matter.

The cache lives where the settings say (HERD_CACHE, HERD_DATABASE_URL, HERD_REDIS_URL)
and is opened on first use, in the worker process (after Celery's prefork), on an
event loop of its own; it is closed at exit.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import Callable

from herd.cache.exact import ExactCache
from herd.cache.stores import open_cache_stores
from herd.config import Settings
from herd.jsonvalue import JSON, canonical
from herd.portal import PortalBacked

NAMESPACE = "celery"
KEY_VERSION = 1  # bump when the key's recipe changes, so old entries stop matching
WAIT = 900.0  # seconds a caller waits for another's call before giving up (SingleflightTimeout)


def cache_key(key: JSON) -> str:
    """sha256 over canonical JSON of the caller's key."""
    return hashlib.sha256(canonical({"v": KEY_VERSION, "key": key}).encode()).hexdigest()


class Once(PortalBacked):
    """``Once()(key, compute)``: ``compute()``'s answer for ``key``, computed once."""

    def __init__(
        self,
        *,
        settings: Settings | None = None,
        namespace: str = NAMESPACE,
        ttl: float | None = None,
        lock_ttl: float | None = None,
        wait: float = WAIT,
        poll_interval: float = 0.2,
    ) -> None:
        """
        settings: where the cache lives (default: the environment, as ``App()``).
        ttl: seconds an answer is fresh (default: HERD_CACHE_TTL; 0 there: forever).
        lock_ttl: seconds a dead holder's lock blocks its key (default: HERD_EVAL_LOCK_TTL).
        wait: the longest a caller waits for another's call.
        """
        super().__init__(f"herd-celery-{namespace}")
        self.settings = settings or Settings.from_env()
        self.namespace = namespace
        self.ttl = ttl if ttl is not None else (self.settings.cache_ttl or None)
        self.lock_ttl = lock_ttl if lock_ttl is not None else float(self.settings.eval_lock_ttl)
        self.wait = wait
        self.poll_interval = poll_interval
        self._cache: ExactCache | None = None
        self._closers: list[object] = []

    async def _open(self) -> None:
        store, locks = await open_cache_stores(self.settings, poll_interval=self.poll_interval)
        self._closers = [locks, store]
        self._cache = ExactCache(
            store,
            locks,
            namespace=self.namespace,
            ttl=self.ttl,
            lock_ttl=self.lock_ttl,
            wait=self.wait,
        )

    async def _close(self) -> None:
        for closer in self._closers:
            await closer.close()  # type: ignore[attr-defined]
        self._closers, self._cache = [], None

    async def _get_or_compute(self, key: str, compute: Callable[[], JSON]) -> JSON:
        assert self._cache is not None

        async def run() -> JSON:
            # The caller's function is blocking (an HTTP call, a client SDK): a thread,
            # so that the lock's renewal goes on while it runs.
            return await asyncio.to_thread(compute)

        return (await self._cache.get_or_compute(key, run)).value

    def __call__(self, key: JSON, compute: Callable[[], JSON]) -> JSON:
        return self._call(self._get_or_compute(cache_key(key), compute))


_default: tuple[int, Once] | None = None
_made = threading.Lock()


def once(key: JSON, compute: Callable[[], JSON]) -> JSON:
    """``compute()``'s answer for ``key`` through herd's exact cache: one call for every
    task, worker and redelivery that asks for the same key (see the module's doc)."""
    global _default
    with _made:
        # Per process: a worker forked from a parent that had one gets its own (the
        # parent's loop thread and connections do not survive the fork).
        if _default is None or _default[0] != os.getpid():
            _default = (os.getpid(), Once())
        found = _default[1]
    return found(key, compute)
