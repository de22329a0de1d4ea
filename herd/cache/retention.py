"""Purges that stores run on themselves: bounded batches, at most every few minutes.

Retention rides on the writes that make state grow, so every deployment has it
without a scheduler; a purge runs in the background and never on a read path.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from herd import aio
from herd.errors import HerdError

log = logging.getLogger("herd.retention")

PURGE_EVERY = 600.0  # seconds between purges per process, as PostgresBroker's claim path
PURGE_BATCH = 5000  # rows per statement: one short transaction, never a table's worth


class Periodic:
    """Start ``purge`` in the background when ``due()`` is called and it last ran
    ``every`` seconds ago (0: never; the owner calls it); its errors are logged and
    retried next time."""

    def __init__(
        self, purge: Callable[[], Awaitable[int]], what: str, every: float = PURGE_EVERY
    ) -> None:
        self._purge, self.what, self.every = purge, what, every
        self._next = 0.0
        self._task: asyncio.Task[None] | None = None

    def ran(self) -> None:
        """The owner purged just now itself: the next one is ``every`` seconds away."""
        self._next = time.monotonic() + self.every

    def due(self) -> None:
        if not self.every:
            return
        if time.monotonic() < self._next or (self._task is not None and not self._task.done()):
            return
        self._next = time.monotonic() + self.every
        self._task = asyncio.create_task(self._run(), name=f"herd-purge-{self.what}")

    async def _run(self) -> None:
        try:
            removed = await self._purge()
        except HerdError as exc:
            log.warning("purging %s failed (retried later): %s", self.what, exc)
            return
        if removed:
            log.info("purged %d rows of %s past their retention", removed, self.what)

    async def wait(self) -> None:
        """The purge now running, if any, to its end (tests, orderly shutdown)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def stop(self) -> None:
        await aio.stop(self._task)


async def in_batches(delete: Callable[[int], Awaitable[int]], batch: int = PURGE_BATCH) -> int:
    """Run ``delete(limit)`` until it removes fewer than ``limit`` rows; the total."""
    removed = 0
    while True:
        n = await delete(batch)
        removed += n
        if n < batch:
            return removed
