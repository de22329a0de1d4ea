"""What a running job's task function is given: ``ctx``, with its lease and its App.

It sits above the App (it holds one) while the task definitions (herd.tasks) sit
below it (the App registers them): two modules, so that the imports run one way.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from psycopg import AsyncConnection

from herd.app import App
from herd.errors import LeaseLost
from herd.jsonvalue import JSON
from herd.queue.base import Lease
from herd.tasks import Task


@dataclass
class JobContext:
    """What a task function receives as ``ctx`` when it asks for it."""

    lease: Lease
    app: App
    worker_id: str
    # Set when the lease is lost or the worker shuts down: a sync task running
    # in a thread cannot be cancelled, so it should check this between steps.
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Given by the worker: confirms the lease, renewing it first if it is not fresh.
    confirm: Callable[[], Awaitable[None]] | None = field(default=None, repr=False)

    async def check_lease(self) -> None:
        """Raise LeaseLost unless this job's lease is still held: call it before an
        expensive step, such as a model call.

        Free while the heartbeat's last renewal is fresh; otherwise one renewal round
        trip. A worker resumed after a pause (SIGSTOP, a suspended VM, a long stall)
        learns here that another worker took the job over, instead of paying for a
        call whose result the fencing would refuse. During a graceful shutdown the
        job is handed back here (the task ends, no attempt counted), rather than
        start a step that the end of the grace period could cut short.
        """
        if self.cancelled.is_set():
            raise LeaseLost(f"job {self.job_id}: the lease is lost or being released")
        if self.confirm is not None:
            await self.confirm()

    @property
    def job_id(self) -> int:
        return self.lease.job_id

    @property
    def payload(self) -> JSON:
        return self.lease.payload

    def fenced_transaction(
        self,
        elsewhere: Callable[[], AbstractAsyncContextManager[AsyncConnection[Any]]] | None = None,
    ) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        """A database transaction that commits only while this job's lease is held.

        On a broker that keeps its jobs in SQL (PostgreSQL) it is the broker's own
        transaction, whose commit checks the lease. On another broker (Redis) nothing
        can join the lease and the write: ``elsewhere`` opens the caller's transaction
        once the lease is checked, so a write lands only from a run that held its lease
        a moment before (the fencing of the job's own result does the rest).
        """
        fenced = self.app.broker.fenced_transaction(self.lease)
        if fenced is not None:
            return fenced
        if elsewhere is None:
            raise NotImplementedError(f"the {self.app.broker.name} broker has no SQL transactions")
        opened = elsewhere

        @asynccontextmanager
        async def checked() -> AsyncIterator[AsyncConnection[Any]]:
            await self.check_lease()
            async with opened() as conn:
                yield conn

        return checked()


async def call_task(
    task: Task, payload: JSON, ctx: JobContext, run_sync: Callable[..., Awaitable[Any]]
) -> Any:
    kwargs = {"ctx": ctx} if task.wants_context else {}
    if task.is_async:
        return await task.fn(payload, **kwargs)
    return await run_sync(task.fn, payload, **kwargs)


__all__ = ["JobContext", "call_task"]
