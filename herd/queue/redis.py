"""The Redis broker: a stream per queue and priority, lease keys with PX, fenced Lua scripts.

Layout (every key of a queue carries the hash tag ``{queue}``, so one queue lives
in one Redis Cluster slot and each script touches one slot):

    herd:{q}:job:<id>      hash: the job (payload, status, counters, token, result)
    herd:{q}:s:<priority>  stream of ready job ids, consumer group "herd"
    herd:{q}:prios         sorted set of the priorities that have a stream
    herd:{q}:lease:<id>    the lease: SET <token> PX <ttl>; gone once expired
    herd:{q}:leases        sorted set: job id by lease expiry (finds expired leases)
    herd:{q}:delayed       sorted set: job id by run_at (backoff, delays)
    herd:{q}:st:<status>   sorted sets of job ids by status (listing, stats)
    herd:{q}:dedup:<key>   the active job holding a dedup key
    herd:{q}:owners        hash: worker -> CLIENT ID of its liveness connection
    herd:{q}:owned:<owner> set: ids of the jobs that worker leased with its mark
    herd:{q}:dlq           stream: a record of every dead-lettering with its reason
    herd:{q}:tp:<minute>   hash: jobs succeeded / dead in that minute (epoch // 60), kept
                           throughput_ttl (HERD_THROUGHPUT_TTL, 2 days)
    herd:{q}:k:<key>       sorted set: the ready jobs of a concurrency key (score 0,
                           members "<1e6 - priority>:<id>" compare as text), never in
                           a stream
    herd:{q}:kready        sorted set: keys with a ready job and room, by turn (kseq)
    herd:{q}:krun, :kwait  hashes: key -> its jobs processing / pending (a key with
                           neither has no field), :kmax key -> its limit
    herd:{q}:kwaitz        sorted set: the keys of :kwait scored by it (the busiest
                           read without reading every key: key_stats.lua)
    herd:{q}:unindexed     list: ids swept from this queue, still to drop from herd:jobq
    herd:{q}:ids, :num     the queue's id counter (floored by the clock) and its number
    herd:{q}:retired       when the queue last gave its number back (redis_numbers)
    herd:{queues}:*        queue numbers (herd.queue.redis_numbers)
    herd:ids, herd:queues, herd:jobq   an older herd's id counter, queues, job id -> queue

Retention: a succeeded job's hash expires finished_ttl after it finished; the
sweep (sweep.lua, run by purge_finished, which workers call as they claim, at most
once a minute per process) then drops its st:succeeded entry, scored by finish
time, and its herd:jobq field; stats() counts st:succeeded by score range, so an
expired job is never counted even before the sweep. Stream entries, lease and
dedup keys go when the job finishes. Dead jobs stay until requeued or purged
(purge_dead, `herd dlq purge`); the dlq record stream is capped at ~10,000
entries and trimmed by the same purge.

Every write after a claim is a script that first compares the lease key with
the caller's token; an expired lease has no key, so it fails the comparison
with no help from any client clock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

from redis import exceptions as rexc

from herd import aio
from herd.config import MAX_QUEUES, Settings, mask_url
from herd.db import redis as rdb
from herd.errors import BrokerError, ConfigError
from herd.jsonvalue import dumps, loads
from herd.names import hash_tag
from herd.queue import redis_schedules as sched
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
from herd.queue.redis_liveness import Liveness
from herd.queue.redis_numbers import (
    QUEUE_BITS,
    RECLAIM_IDLE_MINUTES,
    QueueNumbers,
)
from herd.schedule.model import Schedule, ScheduleState

log = logging.getLogger("herd.redis")

SCRIPTS = (
    "enqueue",
    "claim",
    "renew",
    "complete",
    "fail",
    "release",
    "reschedule",
    "requeue_dead",
    "sweep",
    "purge_dead",
    "stats",
    "key_stats",
    "next_due",
    "queue_number",
    "queue_free",
    "retire",
    "throughput",
    "schedule_save",
    "schedule_pause",
)
SWEEP_BATCH = 1000  # entries one sweep script call examines: bounds its time in Redis
# A stream consumer (one per worker process ever started) with nothing pending goes
# after this long idle; a worker reading again is added back by XREADGROUP.
CONSUMER_IDLE_MS = 3_600_000


@cache
def _lua(name: str, tp_keep: int) -> str:
    folder = resources.files("herd.queue").joinpath("lua")
    common = folder.joinpath("common.lua").read_text(encoding="utf-8")
    # A setting compiled into the scripts rather than one more argument to each.
    return (
        f"local TP_KEEP = {int(tp_keep)}\n"
        + common
        + "\n"
        + folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    )


def prefix(queue: str) -> str:
    return f"herd:{hash_tag(queue, 'queue name', 'queue')}:"


def translate_redis_errors(url: str) -> AbstractContextManager[None]:
    return rdb.translate_errors(url, store="the job store")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _ms(value: str | None) -> datetime | None:
    return datetime.fromtimestamp(int(value) / 1000, UTC) if value else None


class RedisBroker:
    name = "redis"

    @classmethod
    def from_settings(
        cls, settings: Settings, database_url: Callable[[], str], pool_size: int
    ) -> RedisBroker:
        """The broker HERD_BROKER=redis names (herd.queue.registry)."""
        if not settings.redis_url:
            raise ConfigError("the redis broker needs HERD_REDIS_URL (or --redis-url)")
        return cls(
            settings.redis_url,
            finished_ttl=settings.finished_ttl,
            pool_size=pool_size,
            throughput_ttl=settings.throughput_ttl,
            max_queues=settings.max_queues,
        )

    def __init__(
        self,
        url: str,
        *,
        finished_ttl: float = 7 * 86400,
        throughput_ttl: float = 2 * 86400,
        pool_size: int = 8,
        max_queues: int = MAX_QUEUES,
        reclaim_idle_minutes: int = RECLAIM_IDLE_MINUTES,
    ) -> None:
        """``finished_ttl``: seconds a succeeded job's hash (and result) is kept; 0 keeps it.
        ``throughput_ttl``: seconds a per-minute throughput hash is kept; 0 keeps it.
        ``pool_size``: connections this broker may use of the process's pool for ``url``.
        ``max_queues``: queues the server may hold; an enqueue that would add one more is
        refused (InvalidInput). Empty queues give their number back (:meth:`reclaim_queues`)
        once ``reclaim_idle_minutes`` have passed without a job finishing there."""
        self.url = url
        self.finished_ttl = int(finished_ttl)
        self.throughput_ttl = int(throughput_ttl)
        self._next_sweep = 0.0
        self._rotation = 0
        self._sweeping: asyncio.Task[int] | None = None
        self._client = rdb.SharedClient(url, store="the job store", max_size=pool_size)
        self._scripts: dict[str, rdb.Script] = {
            n: self._client.register_script(_lua(n, self.throughput_ttl)) for n in SCRIPTS
        }
        self._scripts["schedule_fire"] = self._client.register_script(
            sched.fire_script(self.throughput_ttl)
        )
        self._warned_aof = False
        self._liveness = Liveness(url, self._client, self._errors, prefix)
        self._numbers = QueueNumbers(
            url,
            lambda: self._redis,
            self._scripts,
            self._errors,
            max_queues=max_queues,
            reclaim_idle_minutes=reclaim_idle_minutes,
        )
        # The highest id counter this process has seen (enqueued or claimed): each
        # enqueue passes it as a floor, so that a server that lost its counters gives
        # this process no id it already holds, however fast the queue ran (enqueue.lua).
        self._seen = 0

    @property
    def cluster(self) -> bool:
        """Whether the server is a Redis Cluster (known once open)."""
        return self._client.cluster

    @property
    def _redis(self) -> Any:
        """The process's client for the URL: a ``RedisCluster`` on a cluster, once open."""
        return self._client.client

    def _errors(self) -> AbstractContextManager[None]:
        return translate_redis_errors(self.url)

    async def _run(self, script: str, queue: str, *args: Any) -> Any:
        with self._errors():
            p = prefix(queue)
            return await self._scripts[script](keys=[p + "meta"], args=[p, *args])

    # -- lifecycle

    def fenced_transaction(self, lease: Lease) -> None:
        """None: Redis has no SQL transaction that a lease could join; a job's writes
        elsewhere are fenced by a lease check before them (JobContext) and the job's
        own result by the completion's compare-then-write."""
        return None

    async def open(self) -> None:
        await self._client.open()
        with self._errors():
            await self._check_persistence()
            # Ids an older herd gave are found through its herd:jobq index only.
            self._numbers.legacy = bool(await self._redis.exists("herd:jobq"))

    async def _check_persistence(self) -> None:
        """Without AOF, Redis forgets acknowledged jobs when it restarts: say so, once."""
        try:
            conf = await self._redis.config_get("appendonly")
        except rexc.ResponseError:
            return  # CONFIG is disabled on many managed servers; they persist by their own rules
        if conf.get("appendonly") != "yes" and not self._warned_aof:
            self._warned_aof = True
            log.warning(
                "Redis at %s runs without AOF (appendonly no): jobs enqueued or finished"
                " since its last snapshot are lost if it restarts; set appendonly yes.",
                mask_url(self.url),
            )

    async def close(self) -> None:
        await self._liveness.release_all()
        if self._sweeping is not None:
            await aio.stop(self._sweeping)
        await self._client.close()

    async def hold_liveness(self, owner: str) -> bool:
        """A liveness mark for ``owner`` (herd.queue.redis_liveness)."""
        return await self._liveness.hold(owner)

    async def release_liveness(self, owner: str) -> None:
        await self._liveness.release(owner)

    # -- producers

    async def enqueue(self, jobs: Sequence[NewJob]) -> list[EnqueueResult]:
        if not jobs:
            return []
        payloads = [payload_text(j) for j in jobs]
        for j in jobs:
            prefix(j.queue)
        by_queue: dict[str, list[int]] = defaultdict(list)
        for i, j in enumerate(jobs):
            by_queue[j.queue].append(i)
        results: dict[int, EnqueueResult] = {}
        todo = dict(by_queue)
        # A number read just before its queue was reclaimed is refused: read again.
        for _ in range(3):
            numbers = [await self._numbers.number(queue) for queue in todo]
            calls = []
            for (queue, idx), (qnum, start, read) in zip(todo.items(), numbers, strict=True):
                args: list[Any] = [queue, len(idx), qnum, start, self._seen, read]
                for i in idx:
                    j = jobs[i]
                    args += [
                        j.task,
                        payloads[i],
                        j.priority,
                        j.dedup_key or "",
                        int(max(0.0, j.delay) * 1000),
                        j.lease_seconds,
                        j.max_attempts,
                        j.max_stalls,
                        trace_text(j) or "",
                        j.concurrency_key or "",
                        j.max_running_per_key,
                    ]
                p = prefix(queue)
                calls.append(([p + "meta"], [p, *args]))
            replies = await self._call_many("enqueue", calls)
            again: dict[str, list[int]] = {}
            for (queue, idx), reply in zip(todo.items(), replies, strict=True):
                if isinstance(reply, (str, bytes)):  # 'renumber': the number is asked again
                    self._numbers.forget(queue)
                    again[queue] = idx
                    continue
                for i, (job_id, created) in zip(idx, reply, strict=True):
                    results[i] = EnqueueResult(int(job_id), bool(created))
            todo = again
            if not todo:
                break
        if todo:
            raise BrokerError(f"the numbers of queues {sorted(todo)} changed while enqueueing")
        self._saw(r.job_id for r in results.values())
        return [results[i] for i in range(len(jobs))]

    # -- workers

    async def claim(self, queues: Sequence[str], owner: str, limit: int) -> list[Lease]:
        if self.finished_ttl and time.monotonic() >= self._next_sweep:
            # As on PostgreSQL, retention rides on claiming, in the background.
            self._next_sweep = time.monotonic() + purge_period(self.finished_ttl)
            self._sweeping = asyncio.create_task(self._sweep_quietly(), name="herd-sweep")
        if limit <= 0 or not queues:
            return []
        leases: list[Lease] = []
        live = {queue: await self._liveness.live_id(owner, queue) for queue in queues}
        dead = await self._liveness.dead_owners(queues)
        # The starting queue rotates (as on PostgreSQL): a busy first queue must not
        # starve the others of a worker that serves several.
        self._rotation = (self._rotation + 1) % len(queues)
        for queue in [*queues[self._rotation :], *queues[: self._rotation]]:
            if len(leases) >= limit:
                break
            rows = await self._run(
                "claim", queue, owner, limit - len(leases), live[queue], *dead.get(queue, ())
            )
            for (
                job_id,
                token,
                expires,
                task,
                payload,
                attempts,
                stalls,
                most,
                ttl,
                trace,
                key,
            ) in rows:
                leases.append(
                    Lease(
                        job_id=int(job_id),
                        token=int(token),
                        task=task,
                        queue=queue,
                        payload=loads(payload),
                        attempts=int(attempts),
                        stalls=int(stalls),
                        max_attempts=int(most),
                        lease_seconds=float(ttl),
                        expires_at=_ms(str(expires)) or datetime.now(UTC),
                        owner=owner,
                        trace_context=trace_of(trace),
                        concurrency_key=key or None,
                    )
                )
        self._saw(lease.job_id for lease in leases)
        return leases

    def _saw(self, job_ids: Iterable[int]) -> None:
        self._seen = max(self._seen, *(i >> QUEUE_BITS for i in job_ids), 0)

    async def _per_queue(self, script: str, leases: Iterable[Lease], extra: Any = ()) -> list[Any]:
        """One script call per queue, all in one pipeline (one round trip)."""
        by_queue: dict[str, list[Lease]] = defaultdict(list)
        for lease in leases:
            by_queue[lease.queue].append(lease)
        if not by_queue:
            return []
        calls = []
        for queue, group in by_queue.items():
            p = prefix(queue)
            args = [p, *extra]
            for lease in group:
                args += [lease.job_id, lease.token]
            calls.append(([p + "meta"], args))
        return await self._call_many(script, calls)

    async def _call_many(self, script: str, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """One script call per queue. A single call goes straight (EVALSHA); a
        pipeline would first ask SCRIPT EXISTS, one more round trip per batch."""
        with self._errors():
            if len(calls) == 1:
                keys, args = calls[0]
                return [await self._scripts[script](keys=keys, args=args)]
            if self._client.cluster:
                # The queues' slots may be on several nodes, and a cluster pipeline
                # cannot load a script a node lacks (a promoted replica): one call each.
                run = self._scripts[script]
                return list(await asyncio.gather(*(run(keys=k, args=a) for k, a in calls)))
            pipe = self._redis.pipeline(transaction=False)
            for keys, args in calls:
                await self._scripts[script](keys=keys, args=args, client=pipe)
            return list(await pipe.execute())

    async def renew_if_leased(self, leases: Sequence[Lease]) -> dict[int, datetime]:
        by_owner: dict[tuple[str, str], list[Lease]] = defaultdict(list)
        for lease in leases:
            by_owner[(lease.queue, lease.owner)].append(lease)
        calls = []
        for (queue, owner), group in by_owner.items():
            p = prefix(queue)
            args: list[Any] = [p, owner, await self._liveness.live_id(owner, queue)]
            for lease in group:
                args += [lease.job_id, lease.token]
            calls.append(([p + "meta"], args))
        out: dict[int, datetime] = {}
        for reply in await self._call_many("renew", calls) if calls else []:
            for job_id, expires in reply:
                out[int(job_id)] = _ms(str(expires)) or datetime.now(UTC)
        return out

    async def complete_and_claim(
        self, items: Sequence[Completion], queues: Sequence[str], owner: str, limit: int
    ) -> tuple[list[bool], list[Lease]]:
        # Two calls: a Redis write does not wait on the disk, so there is no flush to share.
        return await self.complete_if_leased(items), await self.claim(queues, owner, limit)

    async def complete_if_leased(self, items: Sequence[Completion]) -> list[bool]:
        if not items:
            return []
        by_queue: dict[str, list[int]] = defaultdict(list)
        for i, c in enumerate(items):
            by_queue[c.lease.queue].append(i)
        results = [dumps(c.result, what=f"result of job {c.lease.job_id}") for c in items]
        calls = []
        for queue, idx in by_queue.items():
            p = prefix(queue)
            args: list[Any] = [p, self.finished_ttl]
            for i in idx:
                args += [items[i].lease.job_id, items[i].lease.token, results[i]]
            calls.append(([p + "meta"], args))
        replies = await self._call_many("complete", calls)
        ok = [False] * len(items)
        for idx, reply in zip(by_queue.values(), replies, strict=True):
            for i, flag in zip(idx, reply, strict=True):
                ok[i] = bool(flag)
        return ok

    async def fail_if_leased(self, failure: Failure) -> JobStatus | None:
        lease = failure.lease
        status = await self._run(
            "fail",
            lease.queue,
            lease.job_id,
            lease.token,
            int(failure.final),
            failure.reason.value if failure.reason else "fatal",
            int(max(0.0, failure.retry_in) * 1000),
            failure.error,
            failure.traceback or "",
        )
        return JobStatus(status) if status else None

    async def release_if_leased(self, leases: Sequence[Lease], delay: float = 0.0) -> list[int]:
        extra = [int(max(0.0, delay) * 1000)]
        replies = await self._per_queue("release", leases, extra)
        return sorted(int(i) for reply in replies for i in reply)

    async def reschedule(self, job_ids: Sequence[int], delay: float) -> list[int]:
        if not job_ids:
            return []
        queues = await self._numbers.names(job_ids)
        by_queue: dict[str, list[int]] = defaultdict(list)
        for job_id, queue in zip(job_ids, queues, strict=True):
            if queue is not None:
                by_queue[queue].append(job_id)
        delay_ms = int(max(0.0, delay) * 1000)
        calls = [([prefix(q) + "meta"], [prefix(q), delay_ms, *ids]) for q, ids in by_queue.items()]
        replies = await self._call_many("reschedule", calls) if calls else []
        return sorted(int(i) for reply in replies for i in reply)

    async def wait_for_jobs(self, queues: Sequence[str], timeout: float) -> None:
        """Block on the queues' streams until an entry is added (a hint) or timeout."""
        try:
            with self._errors():
                # One XREAD per queue on a cluster (each queue's slot on its own node),
                # one for all on a single server.
                per_queue = [
                    {
                        f"{prefix(queue)}s:{_text(prio)}": "$"
                        for prio in await self._redis.zrange(prefix(queue) + "prios", 0, -1)
                    }
                    for queue in queues
                ]
                if not self._client.cluster:
                    per_queue = [{k: v for streams in per_queue for k, v in streams.items()}]
                block = max(1, int(timeout * 1000))
                waits = [self._redis.xread(st, block=block) for st in per_queue if st]
                if not waits:
                    await asyncio.sleep(timeout)
                    return
                if len(waits) == 1:
                    await waits[0]
                    return
                tasks = [asyncio.ensure_future(w) for w in waits]
                try:
                    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    await aio.stop(*tasks)
        except BrokerError as exc:
            log.debug("wait_for_jobs failed: %s", exc)
            await asyncio.sleep(min(timeout, 1.0))

    # -- inspection and operations

    async def _queue_of(self, job_id: int) -> str | None:
        return (await self._numbers.names([job_id]))[0]

    async def _load(self, queue: str, ids: Sequence[int | str]) -> list[Job]:
        with self._errors():
            pipe = self._redis.pipeline(transaction=False)
            for job_id in ids:
                pipe.hgetall(f"{prefix(queue)}job:{job_id}")
            rows = await pipe.execute()
        return [_job(r) for r in rows if r]

    async def get_job(self, job_id: int) -> Job | None:
        queue = await self._queue_of(job_id)
        if queue is None:
            return None
        jobs = await self._load(queue, [job_id])
        return jobs[0] if jobs else None

    async def get_jobs(self, job_ids: Sequence[int]) -> list[Job]:
        if not job_ids:
            return []
        queues = await self._numbers.names(job_ids)
        by_queue: dict[str, list[int]] = {}
        for job_id, queue in zip(job_ids, queues, strict=True):
            if queue is not None:
                by_queue.setdefault(str(queue), []).append(job_id)
        out: list[Job] = []
        for queue, ids in by_queue.items():
            out += await self._load(queue, ids)
        return out

    async def _queues(self) -> list[str]:
        return await self._numbers.queues()

    async def reclaim_queues(self) -> list[str]:
        """Give back the numbers of queues without any job (run after each sweep), so
        that names used once do not hold numbers, nor dashboard rows, for good. Returns
        the queues reclaimed."""
        empty = [q.queue for q in await self.stats() if not any(q.counts.values())]
        return await self._numbers.reclaim(empty, prefix)

    async def list_jobs(
        self, *, status: JobStatus | None = None, queue: str | None = None, limit: int = 100
    ) -> list[Job]:
        statuses = [status] if status else list(JobStatus)
        queues = [queue] if queue else await self._queues()
        # Two round trips whatever the number of queues: the newest ids of each, then
        # the hashes of the newest ``limit`` of all (the dashboard's "recent" polls this).
        with self._errors():
            pipe = self._redis.pipeline(transaction=False)
            for q in queues:
                for st in statuses:
                    pipe.zrevrange(f"{prefix(q)}st:{st.value}", 0, limit - 1)
            id_lists = await pipe.execute()
        newest = sorted(
            {
                (int(i), q)
                for n, q in enumerate(queues)
                for lst in id_lists[n * len(statuses) : (n + 1) * len(statuses)]
                for i in lst
            },
            reverse=True,
        )[:limit]
        with self._errors():
            pipe = self._redis.pipeline(transaction=False)
            for job_id, q in newest:
                pipe.hgetall(f"{prefix(q)}job:{job_id}")
            rows = await pipe.execute()
        found = [_job(r) for r in rows if r]
        found.sort(key=lambda j: j.id, reverse=True)
        return found

    async def stats(self) -> list[QueueStats]:
        queues = await self._queues()
        if not queues:
            return []
        ttl_ms = self.finished_ttl * 1000
        replies = await self._call_many(
            "stats", [([prefix(q) + "meta"], [prefix(q), ttl_ms]) for q in queues]
        )
        out = []
        for q, (pending, processing, succeeded, dead, ready, oldest, now) in zip(
            queues, replies, strict=True
        ):
            counts = zip(JobStatus, (pending, processing, succeeded, dead), strict=True)
            out.append(
                QueueStats(
                    q,
                    {st: int(n) for st, n in counts if int(n)},
                    ready=max(0, int(ready)),
                    oldest_ready_age=(int(now) - int(oldest)) / 1000 if int(oldest) >= 0 else None,
                )
            )
        return out

    async def next_due(self, queues: Sequence[str]) -> float | None:
        known = set(await self._queues())
        waits = [await self._run("next_due", q) for q in queues if q in known]
        ms = [int(w) for w in waits if int(w) >= 0]
        return min(ms) / 1000 if ms else None

    async def key_stats(self, limit: int = 20) -> list[KeyStats]:
        queues = await self._queues()
        if not queues:
            return []
        n = max(1, limit)
        replies = await self._call_many(
            "key_stats", [([prefix(q) + "meta"], [prefix(q), n]) for q in queues]
        )
        out = [
            KeyStats(q, _text(key), int(run), int(wait), int(most))
            for q, rows in zip(queues, replies, strict=True)
            for key, run, wait, most in rows
        ]
        out.sort(key=lambda k: (-(k.running + k.waiting), k.queue, k.key))
        return out[:n]

    async def purge_finished(self, older_than: float | None = None) -> int:
        """Remove succeeded jobs finished more than ``older_than`` seconds ago (default:
        ``finished_ttl``; 0 there keeps them): the hash if it is still there, the
        st:succeeded entry and the herd:jobq field; also stream consumers idle for an
        hour with nothing pending. Returns how many jobs."""
        keep = self.finished_ttl if older_than is None else older_than
        if older_than is None and not keep:
            return 0
        removed = await self._purge("sweep", await self._queues(), keep, CONSUMER_IDLE_MS)
        await self.reclaim_queues()
        return removed

    async def purge_dead(self, older_than: float, queue: str | None = None) -> int:
        """Delete dead-lettered jobs finished more than ``older_than`` seconds ago, and
        the dlq record stream's entries older than that."""
        queues = [queue] if queue else await self._queues()
        return await self._purge("purge_dead", queues, older_than)

    async def _purge(self, script: str, queues: Sequence[str], keep: float, *extra: Any) -> int:
        removed = 0
        for q in queues:
            p = prefix(q)
            while True:
                ids, seen = await self._run(script, q, int(keep * 1000), SWEEP_BATCH, *extra)
                removed += len(ids)
                await self._unindex(p)
                if int(seen) < SWEEP_BATCH:
                    break
        return removed

    async def _unindex(self, p: str) -> None:
        """Drop the fields of swept jobs from herd:jobq, a key outside the queue's
        slot that no script of the queue may touch (issue 17 moves it into the slot).
        LPOP with a count hands each id to one sweeper; a crash between it and the HDEL
        leaves at most one batch of fields behind."""
        with self._errors():
            while ids := await self._redis.lpop(p + "unindexed", SWEEP_BATCH):
                await self._redis.hdel("herd:jobq", *ids)

    async def _sweep_quietly(self) -> int:
        try:
            removed = await self.purge_finished()
        except BrokerError as exc:
            log.warning("sweeping succeeded jobs failed (retried later): %s", exc)
            return 0
        if removed:
            log.info("swept %d succeeded jobs older than %ds", removed, self.finished_ttl)
        return removed

    async def requeue_dead(self, job_ids: Sequence[int] | None) -> RequeueResult:
        targets: dict[str, list[str]] = defaultdict(list)
        if job_ids is None:
            targets = {q: ["*"] for q in await self._queues()}
        elif job_ids:
            queues = await self._numbers.names(job_ids)
            # In id order, as for '*': of dead jobs sharing a free key, the oldest wins.
            for job_id, queue in sorted(zip(job_ids, queues, strict=True)):
                if queue is not None:
                    targets[str(queue)].append(str(job_id))
        done: list[int] = []
        skipped: list[DedupConflict] = []
        # One script per queue: a conflict in one queue no longer stops the others.
        for queue, ids in targets.items():
            moved, held = await self._run("requeue_dead", queue, *ids)
            done += [int(i) for i in moved]
            skipped += [DedupConflict(int(i), key, int(holder)) for i, key, holder in held]
        return RequeueResult(sorted(done), sorted(skipped, key=lambda c: c.job_id))

    async def _now_ms(self) -> int:
        with self._errors():
            seconds, micros = await self._redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def running(self, limit: int = 100) -> list[RunningJob]:
        queues = await self._queues()
        with self._errors():
            pipe = self._redis.pipeline(transaction=False)
            for q in queues:
                pipe.zrange(prefix(q) + "leases", 0, limit - 1, withscores=True)
            per_queue = await pipe.execute()
        now = await self._now_ms()
        leased = sorted(
            (int(expires), int(job_id), q)
            for q, rows in zip(queues, per_queue, strict=True)
            for job_id, expires in rows
        )[:limit]
        with self._errors():
            pipe = self._redis.pipeline(transaction=False)
            for _, job_id, q in leased:
                pipe.hmget(
                    f"{prefix(q)}job:{job_id}",
                    "task",
                    "owner",
                    "attempts",
                    "lease_seconds",
                    "status",
                )
            fields = await pipe.execute()
        return [
            RunningJob(
                id=job_id,
                task=task,
                queue=q,
                owner=owner or None,
                attempts=int(attempts or 0),
                lease_seconds=float(ttl or 0),
                lease_expires_at=_ms(str(expires)) or datetime.now(UTC),
                lease_left=(expires - now) / 1000,
            )
            for (expires, job_id, q), (task, owner, attempts, ttl, status) in zip(
                leased, fields, strict=True
            )
            if status == JobStatus.PROCESSING  # finished between the two reads
        ]

    async def throughput(self, minutes: int) -> Throughput:
        minutes = max(1, minutes)
        first = await self._now_ms() // 60000 - minutes + 1
        out = Throughput(start=datetime.fromtimestamp(first * 60, UTC), minutes=minutes)
        queues = await self._queues()
        calls = [([prefix(q) + "meta"], [prefix(q), first, minutes]) for q in queues]
        replies = await self._call_many("throughput", calls) if calls else []
        for q, counts in zip(queues, replies, strict=True):
            for i in range(minutes):
                for status, n in (
                    (JobStatus.SUCCEEDED, counts[i]),
                    (JobStatus.DEAD, counts[minutes + i]),
                ):
                    if int(n):
                        out.add(q, status, i, int(n))
        return out

    # -- periodic jobs (herd.queue.redis_schedules)

    async def save_schedules(self, items: Sequence[tuple[Schedule, datetime | None]]) -> None:
        for schedule, tick in items:
            await self._run("schedule_save", schedule.queue, *sched.save_args(schedule, tick))
            with self._errors():
                await self._redis.hset(sched.REGISTRY, schedule.name, schedule.queue)

    async def schedules(self, names: Sequence[str] | None = None) -> list[ScheduleState]:
        with self._errors():
            where: dict[str, str] = await self._redis.hgetall(sched.REGISTRY)
            wanted = sorted(where if names is None else set(names) & set(where))
            if not wanted:
                return []
            pipe = self._redis.pipeline(transaction=False)
            for name in wanted:
                pipe.hgetall(f"{prefix(where[name])}sched:{name}")
            rows = await pipe.execute()
        return [sched.state(r) for r in rows if r]

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
        queue = jobs[0].queue
        if any(j.queue != queue for j in jobs):
            raise BrokerError(f"the jobs of schedule {name!r} must share one queue")
        p = prefix(queue)
        for _ in range(3):  # a number read just before its queue was reclaimed: again
            qnum, start, read = await self._numbers.number(queue)
            args: list[Any] = [p, queue, len(jobs), qnum, start, self._seen, read]
            for j in jobs:
                args += [j.task, payload_text(j), j.priority, j.dedup_key or "",
                         int(max(0.0, j.delay) * 1000), j.lease_seconds, j.max_attempts,
                         j.max_stalls, trace_text(j) or "", j.concurrency_key or "",
                         j.max_running_per_key]  # fmt: skip
            args += [name, sched.micros(after), sched.micros(tick)]
            with self._errors():
                reply = await self._scripts["schedule_fire"](keys=[p + "meta"], args=args)
            if reply == "renumber":
                self._numbers.forget(queue)
                continue
            if isinstance(reply, str):  # 'stale' (fired elsewhere, or paused), 'missing'
                return None
            results = [EnqueueResult(int(job_id), bool(created)) for job_id, created in reply]
            self._saw(r.job_id for r in results)
            return results
        raise BrokerError(f"the number of queue {queue!r} changed while enqueueing")

    async def pause_schedule(self, name: str, paused: bool, floor: datetime | None) -> bool:
        with self._errors():
            queue = await self._redis.hget(sched.REGISTRY, name)
        if queue is None:
            return False
        done = await self._run("schedule_pause", queue, name, int(paused), sched.micros(floor))
        return bool(done)

    async def remove_schedule(self, name: str) -> bool:
        with self._errors():
            queue = await self._redis.hget(sched.REGISTRY, name)
            if queue is None:
                return False
            # The hash first: a schedule still listed but gone fires nothing ('missing').
            await self._redis.delete(f"{prefix(queue)}sched:{name}")
            return bool(await self._redis.hdel(sched.REGISTRY, name))


def _job(h: dict[str, str]) -> Job:
    def opt(key: str) -> str | None:
        return h.get(key) or None

    return Job(
        id=int(h["id"]),
        task=h["task"],
        queue=h["queue"],
        payload=loads(h["payload"]),
        status=JobStatus(h["status"]),
        priority=int(h["priority"]),
        dedup_key=opt("dedup_key"),
        attempts=int(h["attempts"]),
        stalls=int(h["stalls"]),
        max_attempts=int(h["max_attempts"]),
        max_stalls=int(h["max_stalls"]),
        lease_seconds=float(h["lease_seconds"]),
        lease_token=int(h["token"]),
        lease_owner=opt("owner") if h["status"] == JobStatus.PROCESSING else None,
        lease_expires_at=_ms(opt("lease_expires_at")),
        run_at=_ms(h["run_at"]) or datetime.now(UTC),
        created_at=_ms(h["created_at"]) or datetime.now(UTC),
        finished_at=_ms(opt("finished_at")),
        result=loads(h["result"]) if "result" in h else None,
        last_error=opt("last_error"),
        last_traceback=opt("last_traceback"),
        dead_reason=opt("dead_reason"),
        last_worker=opt("last_worker"),
        trace_context=trace_of(opt("trace")),
        concurrency_key=opt("ckey"),
    )
