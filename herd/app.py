"""App: configuration, the task registry, and the producer's API."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, overload

from herd import telemetry
from herd.config import Settings, pool_size
from herd.db.postgres import set_auto_migrate
from herd.embedded import database_url
from herd.errors import BrokerUnavailable, ConfigError, HerdError, InvalidInput, JobNotFound
from herd.jsonvalue import JSON, check, check_text
from herd.queue.base import (
    MAX_CONCURRENCY_KEY_LENGTH,
    MAX_DEDUP_KEY_LENGTH,
    MAX_NAME_LENGTH,
    MAX_PRIORITY,
    MAX_RUNNING_PER_KEY,
    MIN_PRIORITY,
    Broker,
    EnqueueResult,
    Job,
    JobStatus,
    KeyStats,
    NewJob,
    QueueStats,
    RequeueResult,
)
from herd.queue.registry import make_broker
from herd.schedule.model import Policy, Schedule, policy_of
from herd.sync import SyncApp
from herd.tasks import Backoff, Task, TaskFunction, TaskRef

log = logging.getLogger("herd")


class App:
    """A registry of tasks and a connection to one job store.

    No process-wide default: every App names its own broker, given directly,
    or made from settings (``HERD_DATABASE_URL``, else the embedded server).
    """

    def __init__(
        self,
        *,
        settings: Settings | None = None,
        database_url: str | None = None,
        broker: Broker | str | None = None,
        pool_size: int | None = None,
    ) -> None:
        """``broker``: a Broker, or "postgres" / "redis" (default: settings, then postgres).
        ``pool_size``: connections of the process's pool (default: HERD_PG_POOL_SIZE,
        else ``herd.config.pool_size``; a Worker sizes it for its concurrency)."""
        self.settings = (settings or Settings.from_env()).override(
            database_url=database_url, broker=broker if isinstance(broker, str) else None
        )
        self.tasks: dict[str, Task] = {}
        self.schedules: dict[str, Schedule] = {}  # herd.schedule: run by every worker
        self._broker = None if isinstance(broker, str) else broker
        self._pool_size = pool_size
        self._opened = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sync = SyncApp(self)
        # Per-app resources of built-in tasks (evaluation runtime, caches), opened
        # lazily by the first job that needs them and closed with the app.
        self.state: dict[str, Any] = {}
        self._on_close: list[Callable[[], Awaitable[None]]] = []

    # -- task registry

    @overload
    def task(self, fn: TaskFunction, /) -> Task: ...
    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        lease_seconds: float = 30.0,
        max_attempts: int = 3,
        max_stalls: int = 3,
        backoff: Backoff | None = None,
        max_running_per_key: int = 1,
    ) -> Callable[[TaskFunction], Task]: ...

    def task(  # type: ignore[misc]  # mypy misreads the positional-only default
        self,
        fn: TaskFunction | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        lease_seconds: float = 30.0,
        max_attempts: int = 3,
        max_stalls: int = 3,
        backoff: Backoff | None = None,
        max_running_per_key: int = 1,
    ) -> Task | Callable[[TaskFunction], Task]:
        """Register a function (async or sync) as a task: ``fn(payload[, ctx])``.

        ``max_running_per_key``: of its jobs enqueued with a ``concurrency_key``, how
        many of one key may run at once, fleet-wide (claims take turns round the keys)."""

        def register(f: TaskFunction) -> Task:
            task = Task(
                name=name or f"{f.__module__}.{f.__qualname__}",
                fn=f,
                queue=queue,
                priority=priority,
                lease_seconds=lease_seconds,
                max_attempts=max_attempts,
                max_stalls=max_stalls,
                backoff=backoff or Backoff(),
                max_running_per_key=max_running_per_key,
            )
            self.add_task(task)
            return task

        return register(fn) if fn is not None else register

    def add_task(self, task: Task) -> None:
        if task.name in self.tasks and self.tasks[task.name].fn is not task.fn:
            raise ConfigError(f"two different functions are registered as task {task.name!r}")
        self.tasks[task.name] = task

    def include(self, other: App) -> None:
        """Register every task of another app (built-in tasks, a plugin's tasks)."""
        for task in other.tasks.values():
            self.add_task(task)
        for schedule in other.schedules.values():
            self.add_schedule(schedule)

    def periodic(
        self,
        *,
        cron: str | None = None,
        every: float | None = None,
        timezone: str = "UTC",
        queue: str | None = None,
        policy: Policy | str = Policy.SKIP,
        catch_up: int = 1,
        name: str | None = None,
    ) -> Callable[[Task | TaskFunction], Task]:
        """Run a task by itself: at each tick of ``cron`` (5 fields, in ``timezone``) or
        ``every`` seconds, one job for the whole fleet (herd.schedule). Put it above
        ``@app.task`` (or on a bare function, registered as a task with defaults).
        ``policy``: what a firing late runs, ``skip`` (the latest tick) or ``catch_up``
        (the missed ticks too, the newest ``catch_up`` of them)."""

        def register(target: Task | TaskFunction) -> Task:
            task = target if isinstance(target, Task) else self.task(target)
            self.add_schedule(
                Schedule(
                    name=name or task.name,
                    task=task.name,
                    queue=queue or task.queue,
                    cron=cron,
                    every=every,
                    timezone=timezone,
                    policy=policy_of(policy),
                    catch_up=catch_up,
                    priority=task.priority,
                )
            )
            return task

        return register

    def add_schedule(self, schedule: Schedule) -> None:
        if self.schedules.get(schedule.name, schedule) != schedule:
            raise ConfigError(f"two different schedules are named {schedule.name!r}")
        self.schedules[schedule.name] = schedule

    # -- lifecycle

    @property
    def broker(self) -> Broker:
        if self._broker is None:
            self._broker = self._make_broker()
        return self._broker

    def _make_broker(self) -> Broker:
        return make_broker(self.settings, self.database_url, self.pool_size())

    def pool_size(self, concurrency: int | None = None) -> int:
        """The broker's share of the process's pool; a Worker calls this with its
        concurrency before the broker is made (``pool_size`` given wins)."""
        if self._pool_size is None and concurrency is not None and self._broker is None:
            self._pool_size = pool_size(self.settings, concurrency)
        return self._pool_size or pool_size(self.settings)

    async def open(self, *, wait: float = 0.0) -> App:
        """Open the job store; while it is unreachable, retry for up to ``wait`` seconds.

        A fleet restarted together with its broker (a deploy, a failover) would
        otherwise lose every worker that started a moment too early.
        """
        # Every store this process opens later (the ledger's, a cache's) migrates by it.
        set_auto_migrate(self.settings.auto_migrate)
        deadline = time.monotonic() + wait
        delay = 0.2
        while not self._opened:
            try:
                await self.broker.open()
            except BrokerUnavailable as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise
                log.warning("%s; retrying for up to %.0f s more", exc, left)
                await asyncio.sleep(min(delay * random.uniform(0.5, 1.5), left))
                delay = min(delay * 2, 5.0)
                continue
            self._opened = True
            self._loop = asyncio.get_running_loop()
        return self

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop that opened the app (None while closed): its connections
        belong to that loop."""
        return self._loop

    @property
    def sync(self) -> SyncApp:
        """The producer verbs as blocking calls, for code without an event loop (a
        script, a notebook, a WSGI view); opens the app on first use (herd.sync)."""
        return self._sync

    def on_close(self, callback: Callable[[], Awaitable[None]]) -> None:
        self._on_close.append(callback)

    def database_url(self) -> str:
        """herd's PostgreSQL (configured, else embedded): also home of the cache and ledgers."""
        return database_url(self.settings)

    async def close(self) -> None:
        while self._on_close:
            await self._on_close.pop()()
        self.state.clear()
        if self._opened:
            self._opened = False
            self._loop = None
            await self.broker.close()

    async def __aenter__(self) -> App:
        return await self.open()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- producers

    def _new_job(
        self,
        task: TaskRef,
        payload: JSON,
        *,
        queue: str | None,
        priority: int | None,
        dedup_key: str | None,
        delay: float,
        what: str = "payload",
        concurrency_key: str | None = None,
        max_running_per_key: int | None = None,
    ) -> NewJob:
        """The one gate of every producer (Python, CLI, API, built-in features): what
        a store, a listing or a dashboard would choke on later is refused here, with
        the field named."""
        fields = self._job_fields(task, queue, priority, delay, max_running_per_key)
        return self._one_job(fields, payload, dedup_key, what, concurrency_key)

    def _job_fields(
        self,
        task: TaskRef,
        queue: str | None,
        priority: int | None,
        delay: float,
        max_running_per_key: int | None = None,
    ) -> dict[str, Any]:
        """What every job of one enqueue shares, checked once (enqueue_many's jobs too)."""
        name = task.name if isinstance(task, Task) else task
        spec = task if isinstance(task, Task) else self.tasks.get(name)
        if not name:
            raise InvalidInput("a task name is required", field="task")
        check_text(name, "task", max_length=MAX_NAME_LENGTH)
        queue = queue or (spec.queue if spec else "default")
        check_text(queue, "queue", max_length=MAX_NAME_LENGTH)
        priority = priority if priority is not None else (spec.priority if spec else 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidInput(
                f"priority must be an integer, not {type(priority).__name__}", field="priority"
            )
        if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise InvalidInput(
                f"priority is {priority}; the limit is {MIN_PRIORITY} to {MAX_PRIORITY}",
                field="priority",
            )
        if not isinstance(delay, int | float) or not math.isfinite(delay):
            raise InvalidInput(
                f"delay must be a finite number of seconds, not {delay!r}", field="delay"
            )
        limit = max_running_per_key
        if limit is None:
            limit = spec.max_running_per_key if spec else 1
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise InvalidInput(
                f"max_running_per_key must be an integer, not {type(limit).__name__}",
                field="max_running_per_key",
            )
        if not 1 <= limit <= MAX_RUNNING_PER_KEY:
            raise InvalidInput(
                f"max_running_per_key is {limit}; the limit is 1 to {MAX_RUNNING_PER_KEY}",
                field="max_running_per_key",
            )
        return {
            "task": name,
            "queue": queue,
            "priority": priority,
            "delay": delay,
            "max_running_per_key": limit,
            "lease_seconds": spec.lease_seconds if spec else 30.0,
            "max_attempts": spec.max_attempts if spec else 3,
            "max_stalls": spec.max_stalls if spec else 3,
        }

    def _one_job(
        self,
        fields: dict[str, Any],
        payload: JSON,
        dedup_key: str | None,
        what: str,
        concurrency_key: str | None = None,
    ) -> NewJob:
        if dedup_key is not None:
            # An empty key means "none" to the Redis broker and a key to PostgreSQL.
            if dedup_key == "":
                raise InvalidInput("dedup_key is empty; give a key or None", field="dedup_key")
            check_text(dedup_key, "dedup_key", max_length=MAX_DEDUP_KEY_LENGTH)
        if concurrency_key is not None:
            if concurrency_key == "":
                raise InvalidInput(
                    "concurrency_key is empty; give a key or None", field="concurrency_key"
                )
            check_text(concurrency_key, "concurrency_key", max_length=MAX_CONCURRENCY_KEY_LENGTH)
        text = check(
            payload,
            what=what,
            max_depth=self.settings.max_json_depth,
            max_bytes=self.settings.max_payload_bytes,
            limit_name="HERD_MAX_PAYLOAD_BYTES",
        )
        return NewJob(**fields, payload=payload, dedup_key=dedup_key, payload_json=text,
                      concurrency_key=concurrency_key)  # fmt: skip

    async def enqueue(
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
        """Add one job. With a dedup_key held by an active job, returns that job instead.

        ``concurrency_key`` (a tenant, a user): at most ``max_running_per_key`` jobs of
        the key run at once in the queue (default: the task's, else 1)."""
        job = self._new_job(
            task,
            payload,
            queue=queue,
            priority=priority,
            dedup_key=dedup_key,
            delay=delay,
            concurrency_key=concurrency_key,
            max_running_per_key=max_running_per_key,
        )
        with telemetry.sending([job]) as send:
            results = await self.broker.enqueue(send.jobs)
            send.sent(results)
        return results[0]

    async def enqueue_many(
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
        """Add many jobs of one task, ``batch_size`` per round trip (``concurrency_keys``:
        one per payload, as ``dedup_keys``)."""
        items = list(payloads)
        keys = list(dedup_keys) if dedup_keys is not None else [None] * len(items)
        if len(keys) != len(items):
            raise HerdError("dedup_keys must have one entry per payload")
        ckeys = list(concurrency_keys) if concurrency_keys is not None else [None] * len(items)
        if len(ckeys) != len(items):
            raise HerdError("concurrency_keys must have one entry per payload")
        # Every job is checked before the first batch is sent: all are enqueued, or none.
        fields = self._job_fields(task, queue, priority, delay, max_running_per_key)
        jobs = [
            self._one_job(fields, p, k, f"payloads[{i}]", c)
            for i, (p, k, c) in enumerate(zip(items, keys, ckeys, strict=True))
        ]
        out: list[EnqueueResult] = []
        for start in range(0, len(jobs), batch_size):
            with telemetry.sending(jobs[start : start + batch_size]) as send:
                out += await self.broker.enqueue(send.jobs)
        return out

    # -- inspection

    async def get_job(self, job_id: int) -> Job:
        job = await self.broker.get_job(job_id)
        if job is None:
            raise JobNotFound(f"no job has id {job_id}")
        return job

    async def list_jobs(
        self, *, status: JobStatus | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Job]:
        return await self.broker.list_jobs(status=status, queue=queue, limit=limit)

    async def dead_letters(self, *, queue: str | None = None, limit: int = 100) -> list[Job]:
        return await self.broker.list_jobs(status=JobStatus.DEAD, queue=queue, limit=limit)

    async def requeue(self, job_ids: Sequence[int] | None) -> RequeueResult:
        """Send dead-lettered jobs back to the queue (None: all of them).

        A job whose dedup key an active job holds stays dead; it is listed in
        ``skipped`` with the id of that job, and the others are requeued."""
        return await self.broker.requeue_dead(job_ids)

    async def purge_dead(self, older_than: float, queue: str | None = None) -> int:
        """Delete dead-lettered jobs finished more than ``older_than`` seconds ago."""
        return await self.broker.purge_dead(older_than, queue)

    async def stats(self) -> list[QueueStats]:
        return await self.broker.stats()

    async def key_stats(self, limit: int = 20) -> list[KeyStats]:
        """Running and waiting jobs of the ``limit`` busiest concurrency keys."""
        return await self.broker.key_stats(limit)

    def __repr__(self) -> str:
        return f"<herd.App tasks={sorted(self.tasks)}>"
