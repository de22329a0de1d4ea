"""Tasks: named functions a worker runs, with the policy for their jobs."""

from __future__ import annotations

import inspect
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from herd.errors import LeaseLost
from herd.jsonvalue import JSON
from herd.queue.base import MAX_RUNNING_PER_KEY, Lease

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from herd.app import App

TaskFunction = Callable[..., Any]

# herd's own tasks (herd.builtin) are named under this prefix; their payloads are made by
# herd's features (herd eval, herd ingest), so the generic POST /jobs refuses the prefix.
INTERNAL_PREFIX = "herd."


def is_internal(name: str) -> bool:
    return name.startswith(INTERNAL_PREFIX)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: attempt n waits about base * 2**n, at most cap."""

    base: float = 1.0
    cap: float = 300.0

    def delay(self, attempts: int) -> float:
        ceiling = min(self.cap, self.base * 2.0 ** max(0, attempts - 1))
        # "Equal jitter": never zero (no hot retry loop), never in lockstep with peers.
        return ceiling / 2 + random.uniform(0, ceiling / 2)


@dataclass(frozen=True)
class Task:
    name: str
    fn: TaskFunction
    queue: str = "default"
    priority: int = 0
    lease_seconds: float = 30.0
    max_attempts: int = 3
    max_stalls: int = 3
    backoff: Backoff = field(default_factory=Backoff)
    # Jobs of one concurrency key that may run at once (those enqueued with a key).
    max_running_per_key: int = 1

    # Worked out once: inspect.signature on every job cost 7% of a no-op drain.
    is_async: bool = field(init=False, repr=False, compare=False)
    wants_context: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        if self.max_attempts < 1 or self.max_stalls < 1:
            raise ValueError("max_attempts and max_stalls must be at least 1")
        if not 1 <= self.max_running_per_key <= MAX_RUNNING_PER_KEY:
            raise ValueError(f"max_running_per_key must be 1 to {MAX_RUNNING_PER_KEY}")
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))
        object.__setattr__(self, "wants_context", "ctx" in inspect.signature(self.fn).parameters)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling a task runs its function directly, in the caller's process."""
        return self.fn(*args, **kwargs)


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


__all__ = ["INTERNAL_PREFIX", "Backoff", "JobContext", "Task", "call_task", "is_internal"]
