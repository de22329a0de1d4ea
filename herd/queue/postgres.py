"""The PostgreSQL broker: claims with FOR UPDATE SKIP LOCKED, fenced writes in SQL.

Every verb is one statement (or one short transaction) whose WHERE clause
checks the fencing token and the lease expiry against the server clock, so a
worker that lost its lease cannot write, whatever its own clock says.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row

from herd import aio
from herd.config import Settings
from herd.db.postgres import (
    SessionLock,
    SharedPool,
    idle_ms,
    migrate,
    sent_again_if_dropped,
    translate_errors,
)
from herd.db.queries import named
from herd.errors import BrokerError, LeaseLost
from herd.jsonvalue import dumps
from herd.queue.base import (
    Completion,
    DedupConflict,
    EnqueueResult,
    Failure,
    Job,
    JobStatus,
    KeyStats,
    Lease,
    NewJob,
    QueueStats,
    RequeueResult,
    RunningJob,
    Throughput,
    payload_text,
    purge_period,
    trace_of,
    trace_text,
)
from herd.schedule.model import Policy, Schedule, ScheduleState

log = logging.getLogger("herd.postgres")

CHANNEL = "herd_jobs"
# Seconds between one process's looks for jobs whose owner died (claim_orphans), per
# queue: it reads pg_locks, the server's whole lock table, so not on every claim. A
# killed worker's jobs run again within about this plus the claimers' poll interval.
ORPHAN_CHECK = 0.5


def _job(row: dict[str, Any]) -> Job:
    return Job(
        id=row["id"],
        task=row["task"],
        queue=row["queue"],
        payload=row["payload"],
        status=JobStatus(row["status"]),
        priority=row["priority"],
        dedup_key=row["dedup_key"],
        attempts=row["attempts"],
        stalls=row["stalls"],
        max_attempts=row["max_attempts"],
        max_stalls=row["max_stalls"],
        lease_seconds=row["lease_seconds"],
        lease_token=row["lease_token"],
        lease_owner=row["lease_owner"],
        lease_expires_at=row["lease_expires_at"],
        run_at=row["run_at"],
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        result=row["result"],
        last_error=row["last_error"],
        last_traceback=row["last_traceback"],
        dead_reason=row["dead_reason"],
        last_worker=row["last_worker"],
        trace_context=trace_of(row.get("trace_context")),
        concurrency_key=row.get("concurrency_key"),
    )


def _enqueue_params(jobs: Sequence[NewJob]) -> dict[str, str]:
    """The batch as one JSON array for the enqueue statement. Each payload is spliced in
    as the JSON text it was checked as (payload_text), not parsed and dumped again."""
    rows = []
    # The fields beside the payload are most often the same for a whole batch (one
    # task, one queue, no keys): each distinct set is serialized once.
    heads: dict[tuple[Any, ...], str] = {}
    for j in jobs:
        trace = trace_text(j)
        fields = (j.queue, j.task, j.priority, j.dedup_key, j.delay, j.lease_seconds,
                  j.max_attempts, j.max_stalls, trace, j.concurrency_key,
                  j.max_running_per_key)  # fmt: skip
        head = heads.get(fields)
        if head is None:
            head = heads[fields] = json.dumps(
                {
                    "queue": j.queue,
                    "task": j.task,
                    "priority": j.priority,
                    "dedup_key": j.dedup_key,
                    "delay": max(0.0, float(j.delay)),
                    "lease_seconds": float(j.lease_seconds),
                    "max_attempts": j.max_attempts,
                    "max_stalls": j.max_stalls,
                    "trace_context": trace,
                    "concurrency_key": j.concurrency_key,
                    "key_limit": j.max_running_per_key if j.concurrency_key else None,
                },
                allow_nan=False,
            )[:-1]
        rows.append(f'{head},"payload":{payload_text(j)}}}')
    return {"jobs": "[" + ",".join(rows) + "]"}


def _schedule_state(row: dict[str, Any]) -> ScheduleState:
    schedule = Schedule(
        name=row["name"],
        task=row["task"],
        queue=row["queue"],
        cron=row["cron"],
        every=row["every"],
        timezone=row["timezone"],
        policy=Policy(row["policy"]),
        catch_up=row["catch_up"],
        priority=row["priority"],
    )
    return ScheduleState(
        schedule=schedule,
        paused=row["paused"],
        last_tick=row["last_tick"],
        last_job_id=row["last_job_id"],
        last_run_at=row["last_run_at"],
        runs=row["runs"],
    )


def _statements() -> dict[str, str]:
    """The broker's statements as sent: without their comment lines and indentation
    (no string literal of queries.sql spans lines). psycopg parses a statement's
    placeholders once and caches the result only for statements of up to 4,096
    characters: the claim's comments made it longer, and parsing it anew cost a third
    of a worker's CPU in a drain of no-op jobs. complete_and_claim takes the claim's
    text in place of its CLAIM line, so that the claim is written once."""
    q = {
        name: "\n".join(
            line.strip() for line in text.splitlines() if not line.lstrip().startswith("--")
        )
        for name, text in named("herd.queue.sql").items()
    }
    q["complete_and_claim"] = q["complete_and_claim"].replace("\nCLAIM\n", f"\n{q['claim']}\n")
    return q


def _claim_statement(q: dict[str, str], name: str, limit: int) -> str:
    """``name``'s text with its limit written in as a number, one text per limit.

    PostgreSQL plans a prepared statement for its values (a custom plan) until a plan
    for any values (the generic plan) costs no more. A generic plan reads ``LIMIT $1``
    as a tenth of the table, which makes it dear, so with the limit a parameter every
    claim was planned anew: half a millisecond of a claim's 0.8 ms, an empty one
    included (a keyed claimer's whose key is full). With the number in the text the
    generic plan costs what the custom one does and is kept: the claim is planned once
    per connection and limit (a worker's limits are its free slots, a few dozen texts
    at most)."""
    key = f"{name}@{limit}"
    if key not in q:
        q[key] = q[name].replace("%(limit)s", str(int(limit)))
    return key


def _completion_params(items: Sequence[Completion]) -> dict[str, Any]:
    params: dict[str, Any] = dict(_ids_tokens([c.lease for c in items]))
    params["results"] = [dumps(c.result, what=f"result of job {c.lease.job_id}") for c in items]
    return params


def _ids_tokens(leases: Sequence[Lease]) -> dict[str, list[int]]:
    return {"ids": [lease.job_id for lease in leases], "tokens": [lease.token for lease in leases]}


class PostgresBroker:
    name = "postgres"

    @classmethod
    def from_settings(
        cls, settings: Settings, database_url: Callable[[], str], pool_size: int
    ) -> PostgresBroker:
        """The broker HERD_BROKER=postgres names (herd.queue.registry): herd's own
        PostgreSQL, the embedded server when none is set."""
        return cls(
            database_url(),
            pool_size=pool_size,
            finished_ttl=settings.finished_ttl,
            throughput_ttl=settings.throughput_ttl,
            direct_url=settings.database_direct_url,
        )

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        auto_migrate: bool = True,
        finished_ttl: float = 7 * 86400,
        throughput_ttl: float = 2 * 86400,
        direct_url: str | None = None,
    ) -> None:
        """``finished_ttl``: seconds a succeeded job (and its result) is kept; 0 keeps
        it. ``throughput_ttl``: seconds the per-minute throughput rollup is kept.
        Dead-lettered jobs are kept until requeued or purged (:meth:`purge_dead`).
        ``direct_url``: the server itself when ``url`` goes through PgBouncer
        (LISTEN needs a session); the pool is the process's one for ``url``."""
        self.url = url
        self.auto_migrate = auto_migrate
        self.finished_ttl = float(finished_ttl)
        self.throughput_ttl = float(throughput_ttl)
        self._next_purge = 0.0
        self._purging: asyncio.Task[int] | None = None
        self._q = _statements()
        self._pool = SharedPool(
            url, max_size=max(2, pool_size), store="the job store", direct_url=direct_url
        )
        self._rotation = 0
        self._marks: dict[str, SessionLock] = {}
        self._next_orphan_check: dict[str, float] = {}
        self._warned_no_session = False

    # -- lifecycle

    async def open(self) -> None:
        await self._pool.open("herd.queue.sql" if self.auto_migrate else None)

    async def close(self) -> None:
        for owner in list(self._marks):
            await self.release_liveness(owner)
        if self._purging is not None:
            await aio.stop(self._purging)
        await self._pool.close()

    async def hold_liveness(self, owner: str) -> bool:
        """A session-level advisory lock on ``owner``, on a direct connection of its own:
        claims record its key with each job, and another worker's claim takes over a
        job whose key no session holds any more. False when no session can be had
        (a transaction pooler and no direct URL): lease expiry only."""
        if owner in self._marks:
            return await self._marks[owner].wait_held()
        url = self._pool.session_url
        if url is None:
            if not self._warned_no_session:
                self._warned_no_session = True
                log.warning(
                    "the job store goes through a transaction pooler and no direct URL is set"
                    " (HERD_DATABASE_DIRECT_URL): a killed worker's jobs run again only once"
                    " their lease expires"
                )
            return False
        mark = SessionLock(url, owner)
        await mark.acquire()
        self._marks[owner] = mark
        return True

    async def release_liveness(self, owner: str) -> None:
        mark = self._marks.pop(owner, None)
        if mark is not None:
            await mark.release()

    def _live_key(self, owner: str) -> int | None:
        mark = self._marks.get(owner)
        return mark.key if mark is not None and mark.held.is_set() else None

    async def migrate(self) -> list[int]:
        with translate_errors(self.url):
            async with self._pool.connection() as conn:
                return await migrate(conn)

    async def _fetch(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with translate_errors(self.url):
            async with self._pool.connection() as conn:
                cur = await conn.execute(self._q[name], params)
                return await cur.fetchall() if cur.description else []

    async def _fetch_dicts(
        self, name: str, params: dict[str, Any], *, prepare: bool | None = None
    ) -> list[dict[str, Any]]:
        with translate_errors(self.url):
            async with self._pool.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(self._q[name], params, prepare=prepare)
                return await cur.fetchall()

    async def _resent_fetch(
        self, name: str, params: dict[str, Any], *, dicts: bool = False
    ) -> list[Any]:
        """A statement safe to send twice: a worker's claim, completion or renewal
        (fenced: a second run changes nothing), or a read (the dashboard's, the CLI's).
        Sent on a connection that answered within the last second, unchecked, and once
        more on a checked one where that connection had been dropped
        (herd.db.postgres.sent_again_if_dropped). (A connection lost after the statement
        ran is the case of any connection lost mid-answer, unchanged: a claim's jobs
        run again once their lease expires, a completion finds itself in
        already_completed.)"""
        fetch = self._fetch_dicts if dicts else self._fetch
        return await sent_again_if_dropped(lambda: fetch(name, params))

    # -- producers

    async def enqueue(self, jobs: Sequence[NewJob]) -> list[EnqueueResult]:
        if not jobs:
            return []
        inserted = sorted(await self._fetch("enqueue", _enqueue_params(jobs)))
        # Inserted ids ascend in input order; rows skipped by the dedup
        # conflict are absent and resolve to the job that holds the key.
        rows = iter(inserted)
        nxt = next(rows, None)
        by_key: dict[tuple[str, str], int] = {}
        results: dict[int, EnqueueResult] = {}
        for i, job in enumerate(jobs):
            key = (job.queue, job.dedup_key) if job.dedup_key is not None else None
            if key is not None and key in by_key:
                results[i] = EnqueueResult(by_key[key], False)
            elif nxt is not None and (nxt[1], nxt[2]) == (job.queue, job.dedup_key):
                results[i] = EnqueueResult(nxt[0], True)
                if key is not None:
                    by_key[key] = nxt[0]
                nxt = next(rows, None)
        missing = [i for i in range(len(jobs)) if i not in results]
        if missing:
            keys = [(jobs[i].queue, str(jobs[i].dedup_key)) for i in missing]
            existing = await self._fetch(
                "active_by_dedup_key",
                {"queues": [q for q, _ in keys], "keys": [k for _, k in keys]},
            )
            found = {(q, k): job_id for job_id, q, k in existing}
            retry = [i for i, key in zip(missing, keys, strict=True) if key not in found]
            if retry:  # the holder finished between our insert and our look-up
                redo = await self.enqueue([jobs[i] for i in retry])
                results.update(zip(retry, redo, strict=True))
            for i, key in zip(missing, keys, strict=True):
                if i not in results:
                    results[i] = EnqueueResult(found[key], False)
        return [results[i] for i in range(len(jobs))]

    # -- workers

    async def claim(self, queues: Sequence[str], owner: str, limit: int) -> list[Lease]:
        _, leases = await self._claim(queues, owner, limit, ())
        return leases

    async def complete_and_claim(
        self, items: Sequence[Completion], queues: Sequence[str], owner: str, limit: int
    ) -> tuple[list[bool], list[Lease]]:
        """complete_if_leased(items), then claim(queues, owner, limit): the completions
        ride in the statement of the first queue's claim, one commit for both."""
        done, leases = await self._claim(queues, owner, limit, items)
        return await self._settle(items, done), leases

    async def _claim(
        self, queues: Sequence[str], owner: str, limit: int, items: Sequence[Completion]
    ) -> tuple[set[int], list[Lease]]:
        """Claim up to ``limit`` jobs; ``items`` are completed in the first claim
        statement sent (alone when none is). Returns the ids completed and the leases."""
        # One queue per statement, so that each claim walks one queue's index in
        # (priority, id) order instead of sorting every ready job of several
        # queues; the starting queue rotates so that none starves the others.
        leases: list[Lease] = []
        done: set[int] = set()
        completions = _completion_params(items) if items else None
        if time.monotonic() >= self._next_purge:
            # Retention rides on claiming, so every worker fleet has it without a
            # scheduler; in the background, at most every 10 minutes per process.
            self._next_purge = time.monotonic() + purge_period(self.finished_ttl)
            self._purging = asyncio.create_task(self._purge_quietly(), name="herd-purge")
        if limit > 0 and queues:
            self._rotation = (self._rotation + 1) % len(queues)
        live = self._live_key(owner)
        now = time.monotonic()
        order = [*queues[self._rotation :], *queues[: self._rotation]] if limit > 0 else []
        for queue in order:
            if len(leases) >= limit:
                break
            params = {"queue": queue, "owner": owner, "live": live}
            rows = []
            if now >= self._next_orphan_check.get(queue, 0.0):
                # A dead worker's jobs first: they have waited longest.
                self._next_orphan_check[queue] = now + ORPHAN_CHECK
                rows = await self._resent_fetch(
                    "claim_orphans", {**params, "limit": limit - len(leases)}, dicts=True
                )
            want = limit - len(leases) - len(rows)
            if want > 0 and completions is not None:
                found = await self._resent_fetch(
                    _claim_statement(self._q, "complete_and_claim", want),
                    {**params, **completions},
                    dicts=True,
                )
                completions = None
                done.update(found[0].pop("completed"))
                for row in found:
                    row.pop("completed", None)
                rows += [row for row in found if row["job_id"] is not None]
            elif want > 0:
                rows += await self._resent_fetch(
                    _claim_statement(self._q, "claim", want), params, dicts=True
                )
            for row in rows:
                if row.pop("status") != JobStatus.PROCESSING:
                    log.warning("job %s dead-lettered: its lease expired too often", row["job_id"])
                    continue
                trace = trace_of(row.pop("trace_context"))
                leases.append(Lease(**row, owner=owner, trace_context=trace))
        if completions is not None:  # no claim statement was sent
            done.update(row[0] for row in await self._resent_fetch("complete", completions))
        return done, leases

    async def purge_finished(self, older_than: float | None = None, *, batch: int = 5000) -> int:
        """Delete succeeded jobs finished more than ``older_than`` seconds ago (default:
        ``finished_ttl``; 0 there keeps them), in batches; returns how many."""
        keep = self.finished_ttl if older_than is None else older_than
        if older_than is None and not keep:
            return 0
        return await self._batches("purge_finished", {"keep": keep}, batch)

    async def purge_dead(self, older_than: float, queue: str | None = None) -> int:
        """Delete dead-lettered jobs finished more than ``older_than`` seconds ago."""
        return await self._batches("purge_dead", {"keep": older_than, "queue": queue}, 5000)

    async def _batches(self, name: str, params: dict[str, Any], batch: int) -> int:
        # Short statements rather than one big DELETE: each holds its row locks (and
        # the counters' rows) for one batch only, beside working claims.
        removed = 0
        while True:
            rows = await self._fetch(name, {**params, "limit": batch})
            removed += len(rows)
            if len(rows) < batch:
                return removed

    async def fold_counts(self) -> None:
        """Sum the slots of each counter into its slot 0, one counter per transaction."""
        for queue, status in await self._fetch("counters_to_fold", {}):
            await self._fetch("fold_counts", {"queue": queue, "status": status})

    async def prune_keys(self) -> int:
        """Drop the counter rows of concurrency keys with no job running or waiting (the
        purge tick), so that they cost nothing once a key's work is done."""
        return await self._batches("key_counts_prune", {}, 5000)

    async def _purge_quietly(self) -> int:
        try:
            removed = await self.purge_finished()
            if self.throughput_ttl:
                await self._fetch("purge_throughput", {"keep": self.throughput_ttl})
            await self.fold_counts()
            await self._fetch("purge_scheduled", {})
            await self.prune_keys()
        except BrokerError as exc:
            log.warning("purging succeeded jobs failed (retried later): %s", exc)
            return 0
        if removed:
            log.info("purged %d succeeded jobs older than %.0fs", removed, self.finished_ttl)
        return removed

    async def renew_if_leased(self, leases: Sequence[Lease]) -> dict[int, datetime]:
        if not leases:
            return {}
        rows = await self._resent_fetch("renew", _ids_tokens(leases))
        return {job_id: expires for job_id, expires in rows}

    async def complete_if_leased(self, items: Sequence[Completion]) -> list[bool]:
        if not items:
            return []
        done = {row[0] for row in await self._resent_fetch("complete", _completion_params(items))}
        return await self._settle(items, done)

    async def _settle(self, items: Sequence[Completion], done: set[int]) -> list[bool]:
        """Whether each completion landed: ``done`` by the statement just sent, or by
        an earlier try whose reply was lost (the job succeeded under the same token)."""
        refused = [c.lease for c in items if c.lease.job_id not in done]
        if refused:
            done |= {row[0] for row in await self._fetch("already_completed", _ids_tokens(refused))}
        return [c.lease.job_id in done for c in items]

    async def fail_if_leased(self, failure: Failure) -> JobStatus | None:
        lease = failure.lease
        with translate_errors(self.url):
            async with self._pool.connection() as conn, conn.transaction():
                cur = await conn.execute(
                    self._q["fail"],
                    {
                        "id": lease.job_id,
                        "token": lease.token,
                        "final": failure.final,
                        "reason": failure.reason.value if failure.reason else "fatal",
                        "retry_in": max(0.0, failure.retry_in),
                        "error": failure.error,
                        "traceback": failure.traceback,
                    },
                )
                row = await cur.fetchone()
                if row is None:
                    return None
                status = JobStatus(row[0])
                if status == JobStatus.PENDING and failure.retry_in <= 0:
                    await conn.execute(self._q["notify"], {"queues": [row[1]]})
                return status

    async def release_if_leased(self, leases: Sequence[Lease], delay: float = 0.0) -> list[int]:
        if not leases:
            return []
        params = {**_ids_tokens(leases), "delay": max(0.0, delay)}
        return await self._move("release", params)

    async def reschedule(self, job_ids: Sequence[int], delay: float) -> list[int]:
        if not job_ids:
            return []
        return await self._move("reschedule", {"ids": list(job_ids), "delay": max(0.0, delay)})

    async def _move(self, name: str, params: dict[str, Any]) -> list[int]:
        """Run a statement that makes jobs pending (due at once when delay is 0:
        wake the queues' workers then)."""
        with translate_errors(self.url):
            async with self._pool.connection() as conn, conn.transaction():
                cur = await conn.execute(self._q[name], params)
                rows = await cur.fetchall()
                if rows and params["delay"] <= 0:
                    await conn.execute(self._q["notify"], {"queues": sorted({r[1] for r in rows})})
        return sorted(r[0] for r in rows)

    @asynccontextmanager
    async def fenced_transaction(self, lease: Lease) -> AsyncIterator[AsyncConnection[Any]]:
        """A transaction that commits only while ``lease`` is held.

        The job row stays locked until COMMIT, so the writes made on the
        yielded connection (a result upsert, a vector upsert) land only if
        no other worker has taken the job over; otherwise LeaseLost.
        """
        with translate_errors(self.url):
            async with self._pool.connection() as conn, conn.transaction():
                idle = idle_ms(lease.lease_seconds)
                cur = await conn.execute(
                    self._q["check_lease"], {"id": lease.job_id, "token": lease.token, "idle": idle}
                )
                if await cur.fetchone() is None:
                    raise LeaseLost(job_id=lease.job_id)
                yield conn

    async def wait_for_jobs(self, queues: Sequence[str], timeout: float) -> None:
        """Block until a NOTIFY names one of ``queues`` or ``timeout`` passes.

        On the process's one LISTEN connection (shared with the locks'); while it
        is down, or behind a pooler that drops notifications, this is a plain wait
        and the worker's poll finds the jobs.
        """
        wanted = set(queues)
        woken = asyncio.Event()

        def note(payload: str) -> None:
            if payload in wanted:
                woken.set()

        listener = self._pool.listener
        listener.subscribe(CHANNEL, note)
        try:
            await asyncio.wait_for(woken.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            listener.unsubscribe(CHANNEL, note)

    # -- inspection and operations

    async def get_job(self, job_id: int) -> Job | None:
        rows = await self._resent_fetch("get_job", {"id": job_id}, dicts=True)
        return _job(rows[0]) if rows else None

    async def get_jobs(self, job_ids: Sequence[int]) -> list[Job]:
        if not job_ids:
            return []
        rows = await self._resent_fetch("get_jobs", {"ids": list(job_ids)}, dicts=True)
        return [_job(r) for r in rows]

    async def list_jobs(
        self, *, status: JobStatus | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Job]:
        # Planned for its values each time (never prepared): a generic plan cannot see
        # which filters are NULL, nor use the partial index of the status asked for
        # (herd_jobs_dead_id for the dashboard's dead letters).
        params = {"status": status.value if status else None, "queue": queue, "limit": limit}
        rows = await sent_again_if_dropped(
            lambda: self._fetch_dicts("list_jobs", params, prepare=False)
        )
        return [_job(r) for r in rows]

    async def stats(self) -> list[QueueStats]:
        out: dict[str, QueueStats] = {}
        for queue, status, n, ready, oldest in await self._resent_fetch("stats", {}):
            st = out.setdefault(queue, QueueStats(queue))
            st.counts[JobStatus(status)] = n
            if status == JobStatus.PENDING:
                out[queue] = QueueStats(
                    queue, st.counts, ready, float(oldest) if oldest is not None else None
                )
        return list(out.values())

    async def next_due(self, queues: Sequence[str]) -> float | None:
        ((seconds,),) = await self._resent_fetch("next_due", {"queues": list(queues)})
        return None if seconds is None else max(0.0, float(seconds))

    async def requeue_dead(self, job_ids: Sequence[int] | None) -> RequeueResult:
        params = {"all": job_ids is None, "ids": list(job_ids or [])}
        tries = 5
        while True:
            try:
                with translate_errors(self.url):
                    async with self._pool.connection() as conn, conn.transaction():
                        cur = await conn.execute(self._q["requeue_dead"], params)
                        rows = await cur.fetchall()
                        moved = [r for r in rows if r[3] is None]
                        if moved:
                            await conn.execute(
                                self._q["notify"], {"queues": sorted({r[1] for r in moved})}
                            )
            except BrokerError as exc:
                # An enqueue took a key between the statement's snapshot and its write:
                # the next try sees that job as the holder.
                tries -= 1
                if isinstance(exc.__cause__, psycopg.errors.UniqueViolation) and tries:
                    continue
                raise
            return RequeueResult(
                requeued=sorted(r[0] for r in moved),
                skipped=sorted(
                    (DedupConflict(r[0], r[2], r[3]) for r in rows if r[3] is not None),
                    key=lambda c: c.job_id,
                ),
            )

    async def key_stats(self, limit: int = 20) -> list[KeyStats]:
        rows = await self._resent_fetch("key_stats", {"limit": max(1, limit)})
        return [KeyStats(*row) for row in rows]

    async def running(self, limit: int = 100) -> list[RunningJob]:
        rows = await self._resent_fetch("running", {"limit": limit}, dicts=True)
        return [RunningJob(**r) for r in rows]

    async def throughput(self, minutes: int) -> Throughput:
        rows = await self._resent_fetch("throughput", {"minutes": max(1, minutes)})
        out = Throughput(start=rows[0][0], minutes=max(1, minutes))
        for _, queue, i, status, n in rows:
            if queue is not None:
                out.add(queue, JobStatus(status), i, n)
        return out

    # -- periodic jobs

    async def save_schedules(self, items: Sequence[tuple[Schedule, datetime | None]]) -> None:
        if not items:
            return
        params: dict[str, list[Any]] = {
            "name": [s.name for s, _ in items],
            "task": [s.task for s, _ in items],
            "queue": [s.queue for s, _ in items],
            "cron": [s.cron for s, _ in items],
            "every": [s.every for s, _ in items],
            "timezone": [s.timezone for s, _ in items],
            "policy": [s.policy.value for s, _ in items],
            "catch_up": [s.catch_up for s, _ in items],
            "priority": [s.priority for s, _ in items],
            "last_tick": [tick for _, tick in items],
        }
        await self._fetch("schedules_save", params)

    async def schedules(self, names: Sequence[str] | None = None) -> list[ScheduleState]:
        params = {"all": names is None, "names": list(names or [])}
        rows = await self._resent_fetch("schedules_list", params, dicts=True)
        return [_schedule_state(r) for r in rows]

    async def fire_schedule(
        self,
        name: str,
        jobs: Sequence[NewJob],
        *,
        after: datetime | None,
        tick: datetime | None,
    ) -> list[EnqueueResult] | None:
        if not jobs:
            return []
        ids: list[int] = []
        with translate_errors(self.url):
            async with self._pool.connection() as conn, conn.transaction():
                if tick is not None:
                    cur = await conn.execute(
                        self._q["schedule_advance"], {"name": name, "after": after, "tick": tick}
                    )
                    if await cur.fetchone() is None:
                        return None  # fired by another worker, or paused: nothing written
                cur = await conn.execute(self._q["enqueue"], _enqueue_params(jobs))
                ids = sorted(row[0] for row in await cur.fetchall())
                cur = await conn.execute(
                    self._q["schedule_ran"], {"name": name, "job_id": ids[-1], "n": len(ids)}
                )
                if await cur.fetchone() is None:
                    ids = []
                    raise psycopg.Rollback()  # run-now of a schedule nobody registered
        return [EnqueueResult(job_id, True) for job_id in ids] if ids else None

    async def pause_schedule(self, name: str, paused: bool, floor: datetime | None) -> bool:
        rows = await self._fetch("schedule_pause", {"name": name, "paused": paused, "floor": floor})
        return bool(rows)

    async def remove_schedule(self, name: str) -> bool:
        return bool(await self._fetch("schedule_remove", {"name": name}))
