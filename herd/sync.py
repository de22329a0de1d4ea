"""Blocking producer verbs for scripts, notebooks and WSGI apps: ``app.sync``.

    app = App()
    job = app.sync.enqueue("summarize", {"doc": "paper.pdf"})
    app.sync.get_job(job.id).status

The work runs on an event loop that the facade owns, in a thread of its own
(herd.portal): the caller's thread needs no loop, and a caller on a running loop
(a Jupyter cell) blocks only itself while the facade's loop does the work, so
nothing deadlocks. The App is opened there on first use and closed at exit, or
by ``close()`` (or ``with app.sync:``).

An App that an event loop of its own opened (a worker whose sync task enqueues a
follow-up, an ``async with app`` in another thread) is used where it lives: its
connections belong to that loop, so the call is sent there. From that loop's own
thread the call could never finish, so it is refused with a clear error instead.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, Protocol, Self, TypeVar

from herd.errors import HerdError
from herd.jsonvalue import JSON
from herd.portal import Portal
from herd.queue.base import EnqueueResult, Job, JobStatus, KeyStats, QueueStats, RequeueResult
from herd.tasks import TaskRef

T = TypeVar("T")

# One of the App's async producer verbs: whatever it takes, a coroutine of its result.
Verb = Callable[..., Coroutine[Any, Any, T]]


class AsyncProducer(Protocol):
    """What the facade needs of an App: the loop that opened it, open and close, and
    the async verbs it mirrors, each given the facade's own arguments. Declared here
    so that the App imports its facade and not the other way round."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...
    async def open(self) -> object: ...
    async def close(self) -> None: ...
    @property
    def enqueue(self) -> Verb[EnqueueResult]: ...
    @property
    def enqueue_many(self) -> Verb[list[EnqueueResult]]: ...
    @property
    def get_job(self) -> Verb[Job]: ...
    @property
    def list_jobs(self) -> Verb[list[Job]]: ...
    @property
    def dead_letters(self) -> Verb[list[Job]]: ...
    @property
    def requeue(self) -> Verb[RequeueResult]: ...
    @property
    def purge_dead(self) -> Verb[int]: ...
    @property
    def stats(self) -> Verb[list[QueueStats]]: ...
    @property
    def key_stats(self) -> Verb[list[KeyStats]]: ...


class SyncApp:
    """The App's producer verbs as blocking calls; same names, arguments and results."""

    def __init__(self, app: AsyncProducer) -> None:
        self._app = app
        self._portal: Portal | None = None
        self._guard = threading.Lock()  # one portal, one open, however many threads start

    # -- life

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            loop = self._app.loop
            if loop is None or (self._portal is not None and loop is self._portal.loop):
                return self._open().call(coro)
            self._check(loop)
        except BaseException:
            if inspect.getcoroutinestate(coro) == inspect.CORO_CREATED:
                coro.close()  # a refusal or a failed open: no "never awaited" warning
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    @staticmethod
    def _check(loop: asyncio.AbstractEventLoop) -> None:
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise HerdError(
                "app.sync was called on the event loop that opened this App, which would"
                " wait for itself forever: await the async verb (await app.enqueue(...)) there"
            )
        if not loop.is_running():
            raise HerdError(
                "this App was opened by an event loop that no longer runs: close it in that"
                " loop (async with app: ...) or use app.sync on an App that was never opened"
            )

    def _open(self) -> Portal:
        with self._guard:
            if self._portal is None:
                self._portal = Portal("herd-sync", on_exit=self._close_app)
            if self._app.loop is None:
                self._portal.call(self._app.open())
            return self._portal

    async def _close_app(self) -> None:
        if self._portal is not None and self._app.loop is self._portal.loop:
            await self._app.close()

    def close(self) -> None:
        """Close the App if this facade opened it, and stop the facade's loop; a later
        call opens both again."""
        with self._guard:
            if self._portal is not None:
                try:
                    self._portal.call(self._close_app())
                finally:
                    self._portal.stop()
                    self._portal = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- producers: each mirrors the App's async verb of the same name

    def enqueue(
        self,
        task: TaskRef,
        payload: JSON = None,
        *,
        queue: str | None = None,
        priority: int | None = None,
        dedup_key: str | None = None,
        delay: float = 0.0,
        concurrency_key: str | None = None,
        max_running_per_key: int | None = None,
    ) -> EnqueueResult:
        """Add one job. With a dedup_key held by an active job, returns that job instead."""
        return self._run(
            self._app.enqueue(
                task,
                payload,
                queue=queue,
                priority=priority,
                dedup_key=dedup_key,
                delay=delay,
                concurrency_key=concurrency_key,
                max_running_per_key=max_running_per_key,
            )
        )

    def enqueue_many(
        self,
        task: TaskRef,
        payloads: Iterable[JSON],
        *,
        queue: str | None = None,
        priority: int | None = None,
        dedup_keys: Sequence[str | None] | None = None,
        delay: float = 0.0,
        batch_size: int = 1000,
        concurrency_keys: Sequence[str | None] | None = None,
        max_running_per_key: int | None = None,
    ) -> list[EnqueueResult]:
        """Add many jobs of one task, ``batch_size`` per round trip."""
        return self._run(
            self._app.enqueue_many(
                task,
                payloads,
                queue=queue,
                priority=priority,
                dedup_keys=dedup_keys,
                delay=delay,
                batch_size=batch_size,
                concurrency_keys=concurrency_keys,
                max_running_per_key=max_running_per_key,
            )
        )

    def get_job(self, job_id: int) -> Job:
        return self._run(self._app.get_job(job_id))

    def list_jobs(
        self, *, status: JobStatus | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Job]:
        return self._run(self._app.list_jobs(status=status, queue=queue, limit=limit))

    def dead_letters(self, *, queue: str | None = None, limit: int = 100) -> list[Job]:
        return self._run(self._app.dead_letters(queue=queue, limit=limit))

    def requeue(self, job_ids: Sequence[int] | None) -> RequeueResult:
        """Send dead-lettered jobs back to the queue (None: all of them)."""
        return self._run(self._app.requeue(job_ids))

    def purge_dead(self, older_than: float, queue: str | None = None) -> int:
        """Delete dead-lettered jobs finished more than ``older_than`` seconds ago."""
        return self._run(self._app.purge_dead(older_than, queue))

    def stats(self) -> list[QueueStats]:
        return self._run(self._app.stats())

    def key_stats(self, limit: int = 20) -> list[KeyStats]:
        """Running and waiting jobs of the ``limit`` busiest concurrency keys."""
        return self._run(self._app.key_stats(limit))

    def __repr__(self) -> str:
        return f"<herd.SyncApp of {self._app!r}>"
