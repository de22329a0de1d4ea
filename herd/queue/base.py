"""The broker protocol: a flat list of verbs every backend implements.

Shaped after River's driver interface: each write that follows a claim is a
``…_if_leased`` verb that acts only while the caller still holds the lease,
checked by the server in the same statement (SQL ``WHERE``) or script (Lua) as
the write. One contract suite (tests/contract) runs against every backend.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from herd.errors import InvalidInput
from herd.jsonvalue import JSON, dumps, loads
from herd.schedule.model import Schedule, ScheduleState

if TYPE_CHECKING:
    from psycopg import AsyncConnection

# What a job's fields may hold, checked at enqueue (App) and by the API's models. A
# priority names a Redis stream and a PostgreSQL integer; names and keys are indexed.
MAX_NAME_LENGTH = 200  # task and queue names
MAX_DEDUP_KEY_LENGTH = 1000
MAX_CONCURRENCY_KEY_LENGTH = 200  # a concurrency key names a Redis key and a counter row
MAX_RUNNING_PER_KEY = 1_000_000
MIN_PRIORITY, MAX_PRIORITY = -1_000_000, 1_000_000
# A job's trace context (its W3C traceparent is 55 bytes, a tracestate at most 512):
# keys and values together, so a carrier cannot grow a job's every read.
MAX_TRACE_CONTEXT_BYTES = 2048


class JobStatus(enum.StrEnum):
    PENDING = "pending"  # waiting to run (possibly delayed until run_at)
    PROCESSING = "processing"  # leased by a worker
    SUCCEEDED = "succeeded"
    DEAD = "dead"  # in the dead-letter queue

    @property
    def active(self) -> bool:
        return self in (JobStatus.PENDING, JobStatus.PROCESSING)


class DeadReason(enum.StrEnum):
    MAX_ATTEMPTS = "max_attempts"  # the task raised max_attempts times
    MAX_STALLS = "max_stalls"  # the lease expired max_stalls times (crashed or frozen workers)
    FATAL = "fatal"  # the task raised herd.Fatal
    UNKNOWN_TASK = "unknown_task"
    BAD_RESULT = "bad_result"  # the task returned something that is not JSON


@dataclass(frozen=True)
class NewJob:
    task: str
    payload: JSON
    queue: str = "default"
    priority: int = 0
    dedup_key: str | None = None
    delay: float = 0.0
    lease_seconds: float = 30.0
    max_attempts: int = 3
    max_stalls: int = 3
    # The context the job was enqueued in (herd.telemetry): a propagator's carrier,
    # e.g. {"traceparent": ..., "tracestate": ...}; its run continues that trace.
    trace_context: dict[str, str] | None = None
    # Concurrency key: at most ``max_running_per_key`` jobs of the key run at once in
    # the queue, fleet-wide (the latest enqueued job's limit rules the key); claims
    # take turns round the keys. None: no key, no limit.
    concurrency_key: str | None = None
    max_running_per_key: int = 1
    # The payload as stored, when the producer (App) has checked and serialized it
    # already: a 300,000-job enqueue then serializes each payload once, not twice.
    payload_json: str | None = field(default=None, repr=False, compare=False)


def payload_text(job: NewJob) -> str:
    """What a broker stores for the job's payload."""
    if job.payload_json is not None:
        return job.payload_json
    return dumps(job.payload, what=f"payload of {job.task!r}")


def trace_text(job: NewJob) -> str | None:
    """What a broker stores for the job's trace context (None: none)."""
    carrier = job.trace_context
    if not carrier:
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in carrier.items()):
        raise InvalidInput("trace_context must map strings to strings", field="trace_context")
    size = sum(len(k) + len(v) for k, v in carrier.items())
    if size > MAX_TRACE_CONTEXT_BYTES:
        raise InvalidInput(
            f"trace_context is {size} characters; the limit is {MAX_TRACE_CONTEXT_BYTES}",
            field="trace_context",
        )
    return dumps(carrier, what="trace_context")


def trace_of(text: str | None) -> dict[str, str] | None:
    """The trace context as a broker stored it (JSON text, or NULL/'' for none)."""
    if not text:
        return None
    value = loads(text)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else None


@dataclass(frozen=True)
class Job:
    id: int
    task: str
    queue: str
    payload: JSON
    status: JobStatus
    priority: int
    dedup_key: str | None
    attempts: int
    stalls: int
    max_attempts: int
    max_stalls: int
    lease_seconds: float
    lease_token: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    run_at: datetime
    created_at: datetime
    finished_at: datetime | None
    result: JSON
    last_error: str | None
    last_traceback: str | None
    dead_reason: str | None
    last_worker: str | None
    trace_context: dict[str, str] | None = None
    concurrency_key: str | None = None


@dataclass(frozen=True)
class EnqueueResult:
    job_id: int
    created: bool  # False: an active job with the same dedup_key already existed


@dataclass(frozen=True)
class DedupConflict:
    """A dead job left dead: requeued, it would share its dedup key with an active job."""

    job_id: int
    dedup_key: str
    held_by: int  # the active job that holds the key


@dataclass(frozen=True)
class RequeueResult:
    requeued: list[int]  # ascending
    skipped: list[DedupConflict] = field(default_factory=list)  # by job id


@dataclass(frozen=True)
class Lease:
    """A claimed job, with the fencing token every later write must carry."""

    job_id: int
    token: int
    task: str
    queue: str
    payload: JSON
    attempts: int  # errors so far, before this run
    stalls: int
    max_attempts: int
    lease_seconds: float
    expires_at: datetime  # server time
    owner: str
    trace_context: dict[str, str] | None = None  # as enqueued (NewJob.trace_context)
    concurrency_key: str | None = None  # as enqueued (NewJob.concurrency_key)


@dataclass(frozen=True)
class Completion:
    lease: Lease
    result: JSON


@dataclass(frozen=True)
class Failure:
    lease: Lease
    error: str
    traceback: str | None = None
    retry_in: float = 0.0  # seconds from server now() until the retry may run
    final: bool = False  # skip the remaining attempts (herd.Fatal, unknown task, bad result)
    reason: DeadReason | None = None  # recorded if the job is dead-lettered


@dataclass(frozen=True)
class QueueStats:
    queue: str
    counts: dict[JobStatus, int] = field(default_factory=dict)
    ready: int = 0  # pending and due now
    # Seconds the oldest due job has waited; on PostgreSQL the one next in line (the
    # head of the claim order, one index entry), the same unless a priority or a retry
    # put a younger job first.
    oldest_ready_age: float | None = None


@dataclass(frozen=True)
class KeyStats:
    """One concurrency key's jobs, from counters kept as they change (never a count)."""

    queue: str
    key: str
    running: int
    waiting: int  # pending, delayed ones included
    # None where the key bounds nothing: at MAX_RUNNING_PER_KEY it gives turns only
    # (an evaluation batch's key), and every surface says "none", not a million.
    max_running: int | None

    def __post_init__(self) -> None:
        if self.max_running is not None and self.max_running >= MAX_RUNNING_PER_KEY:
            object.__setattr__(self, "max_running", None)


@dataclass(frozen=True)
class RunningJob:
    """A leased job as the dashboard shows it; times from the store's clock."""

    id: int
    task: str
    queue: str
    owner: str | None
    attempts: int
    lease_seconds: float
    lease_expires_at: datetime
    lease_left: float  # seconds until the lease expires (negative: expired, not yet taken over)


@dataclass(frozen=True)
class Throughput:
    """Jobs finished per minute: ``succeeded[queue][i]`` counts minute ``start + i``."""

    start: datetime  # the first minute, by the store's clock
    minutes: int
    succeeded: dict[str, list[int]] = field(default_factory=dict)
    dead: dict[str, list[int]] = field(default_factory=dict)

    def add(self, queue: str, status: JobStatus, minute: int, n: int) -> None:
        """Count ``n`` jobs of ``queue`` that reached ``status`` in minute ``start + minute``."""
        for counts in (self.succeeded, self.dead):
            counts.setdefault(queue, [0] * self.minutes)
        if 0 <= minute < self.minutes:
            (self.succeeded if status == JobStatus.SUCCEEDED else self.dead)[queue][minute] += n


def purge_period(finished_ttl: float) -> float:
    """Seconds between a process's background purges of finished jobs.

    A quarter of the retention, so what is kept stays within 1.25 x the TTL, but
    no more often than every 5 s and no less often than every 10 minutes.
    """
    return min(600.0, max(5.0, finished_ttl / 4)) if finished_ttl > 0 else 600.0


@runtime_checkable
class Broker(Protocol):
    """What a worker and an App need from a job store."""

    name: str  # its key in herd.queue.registry.BROKERS
    url: str  # where its jobs live (the limiter that shares the store opens it too)

    async def open(self) -> None: ...
    async def close(self) -> None: ...

    def fenced_transaction(
        self, lease: Lease
    ) -> AbstractAsyncContextManager[AsyncConnection[Any]] | None:
        """A SQL transaction in the job store that commits only while ``lease`` is
        held; None where the store has no SQL transactions to join the lease with."""
        ...

    # -- producers
    async def enqueue(self, jobs: Sequence[NewJob]) -> list[EnqueueResult]: ...

    # -- workers
    async def hold_liveness(self, owner: str) -> bool:
        """Hold a liveness mark for ``owner`` (one worker process) until
        :meth:`release_liveness`, or until this process's connection to the store dies.

        A claim takes over at once a job whose owner's mark is gone (its process was
        killed); while the mark stands (a frozen process keeps its connection) the
        lease expiry rules. Call it before the owner's first claim: a claim records
        the mark with each job. False: this store can hold none here (lease expiry
        only). An owner whose mark another live process holds is refused (BrokerError).
        Asked again while the mark is being remade (its connection broke), it waits
        for it (10 s at most) and says whether it stands.
        """
        ...

    async def release_liveness(self, owner: str) -> None:
        """Drop ``owner``'s mark (graceful stop, after its jobs were given back)."""
        ...

    async def claim(self, queues: Sequence[str], owner: str, limit: int) -> list[Lease]: ...
    async def renew_if_leased(self, leases: Sequence[Lease]) -> dict[int, datetime]:
        """Extend every lease still held; returns job_id -> new expiry for those renewed."""
        ...

    async def complete_if_leased(self, items: Sequence[Completion]) -> list[bool]:
        """Store results and mark jobs succeeded; False where the lease was lost."""
        ...

    async def complete_and_claim(
        self, items: Sequence[Completion], queues: Sequence[str], owner: str, limit: int
    ) -> tuple[list[bool], list[Lease]]:
        """complete_if_leased(items) and claim(queues, owner, limit) in one write where
        the store allows it (a worker's finished jobs go with its next claim): each
        completion fenced as complete_if_leased fences it."""
        ...

    async def fail_if_leased(self, failure: Failure) -> JobStatus | None:
        """Record an error; the job is retried or dead-lettered. None: lease lost."""
        ...

    async def release_if_leased(self, leases: Sequence[Lease], delay: float = 0.0) -> list[int]:
        """Give jobs back without counting an attempt or a stall (graceful shutdown,
        herd.Snooze), due again ``delay`` seconds from the store's now."""
        ...

    async def reschedule(self, job_ids: Sequence[int], delay: float) -> list[int]:
        """Make the pending jobs of these ids due ``delay`` seconds from the store's now
        (0: at once); running and finished jobs are untouched. Returns the ids moved,
        ascending."""
        ...

    async def wait_for_jobs(self, queues: Sequence[str], timeout: float) -> None:
        """Return when new work may be there, or after timeout (a hint, never a guarantee)."""
        ...

    # -- inspection and operations
    async def get_job(self, job_id: int) -> Job | None: ...
    async def get_jobs(self, job_ids: Sequence[int]) -> list[Job]:
        """The jobs of these ids that exist, in one round trip (in no set order)."""
        ...

    async def list_jobs(
        self, *, status: JobStatus | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Job]: ...
    async def stats(self) -> list[QueueStats]: ...
    async def next_due(self, queues: Sequence[str]) -> float | None:
        """Seconds until the first pending job of these queues is due (0.0: one is due
        now), None when none is pending. An idle worker asked to stop when idle reads it:
        a job held far out (a parked batch's) is not work it can wait for."""
        ...

    async def requeue_dead(self, job_ids: Sequence[int] | None) -> RequeueResult:
        """Move dead-lettered jobs back to pending with fresh counters; None means all.

        A job whose dedup key an active job holds is skipped and reported, never
        blocking the others."""
        ...

    async def purge_finished(self, older_than: float | None = None) -> int:
        """Delete succeeded jobs finished more than ``older_than`` seconds ago (default:
        the broker's ``finished_ttl``, where 0 keeps them) with every index entry they
        have; returns how many. Workers call it now and then as they claim."""
        ...

    async def purge_dead(self, older_than: float, queue: str | None = None) -> int:
        """Delete dead-lettered jobs (of ``queue``, or of all) finished more than
        ``older_than`` seconds ago; returns how many. Nothing else removes them."""
        ...

    async def key_stats(self, limit: int = 20) -> list[KeyStats]:
        """Running and waiting jobs of the ``limit`` busiest concurrency keys (running
        plus waiting), from counters: the cost follows the keys with work."""
        ...

    async def running(self, limit: int = 100) -> list[RunningJob]:
        """Leased jobs, soonest lease expiry first (read-only: for dashboards)."""
        ...

    async def throughput(self, minutes: int) -> Throughput:
        """Jobs that succeeded or were dead-lettered in each of the last ``minutes``
        minutes, the current one included (read-only: for dashboards)."""
        ...

    # -- periodic jobs (herd.schedule)
    async def save_schedules(self, items: Sequence[tuple[Schedule, datetime | None]]) -> None:
        """Register schedules: a new one starts at its tick given (the latest at or before
        now); a known one keeps its state (paused, last tick) and takes the definition."""
        ...

    async def schedules(self, names: Sequence[str] | None = None) -> list[ScheduleState]:
        """The stored schedules (of ``names``, or all), by name."""
        ...

    async def fire_schedule(
        self,
        name: str,
        jobs: Sequence[NewJob],
        *,
        after: datetime | None,
        tick: datetime | None,
    ) -> list[EnqueueResult] | None:
        """Enqueue ``jobs`` (all on the schedule's queue) as the schedule's run, atomically
        with moving its last tick from ``after`` to ``tick``: None, and nothing enqueued,
        when the last tick is not ``after`` (another worker fired it) or the schedule is
        paused. ``tick`` None: a run asked for by hand (run-now), which moves no tick and
        runs while paused; None when there is no such schedule."""
        ...

    async def pause_schedule(self, name: str, paused: bool, floor: datetime | None) -> bool:
        """Pause or resume; a resume moves the last tick up to ``floor`` (the ticks of the
        pause are not back-filled). False: no such schedule."""
        ...

    async def remove_schedule(self, name: str) -> bool:
        """Forget a schedule, its definition and its state (a worker of an app that
        still defines it registers it again). False: no such schedule."""
        ...
