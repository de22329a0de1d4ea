"""Contract: a concurrency key's jobs run at most max_running_per_key at once, fleet-wide;
claims take turns round the keys; a slot comes back exactly once, whatever ends the run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from herd.queue.base import Broker, Completion, Failure, JobStatus, KeyStats, NewJob
from herd.testing.fleet import Fleet, worker_env
from tests.helpers import LeaseRun, eventually, job, within_lease

ROOT = Path(__file__).resolve().parents[2]
PROCESSES, CLAIMERS = 3, 16
QUEUE = "keyed"
# A worker process as `herd worker` runs it (as tests/contract/test_takeover.py's).
WORKER = f"""
import asyncio
from herd.worker import Worker
from tests.apps.crashapp import app
asyncio.run(Worker(app, queues=["{QUEUE}"], concurrency=4, poll_interval=0.2).run())
"""


@pytest.fixture
def fleet(broker, request, tmp_path) -> Iterator[Fleet]:
    store = {"database_url" if broker.name == "postgres" else "redis_url": broker.url}
    if broker.name == "postgres" and broker.url != request.getfixturevalue("pg_url"):
        store["HERD_DATABASE_DIRECT_URL"] = request.getfixturevalue("pg_url")  # PgBouncer
    env = worker_env(broker=broker.name, pythonpath=[ROOT], **store)
    with Fleet([sys.executable, "-c", WORKER], env, logs=tmp_path, cwd=ROOT) as workers:
        yield workers


def keyed(key: str, limit: int, **kw: object) -> NewJob:
    payload = kw.pop("payload", {"key": key})
    return job(payload=payload, concurrency_key=key, max_running_per_key=limit, **kw)


async def counts(broker: Broker, key: str, queue: str = "default") -> tuple[int, int]:
    for k in await broker.key_stats(1000):
        if (k.queue, k.key) == (queue, key):
            return k.running, k.waiting
    return 0, 0


def max_overlap(intervals: list[tuple[int, int]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    inside = best = 0
    for _, d in events:
        inside += d
        best = max(best, inside)
    return best


async def test_three_processes_of_sixteen_claimers_never_run_more_than_the_limit(broker):
    keys = {"tenant:a": 2, "tenant:b": 2, "tenant:c": 1}
    jobs = [keyed(k, limit, queue="race") for k, limit in keys.items() for _ in range(40)]
    await broker.enqueue(jobs)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.apps.keyrace", broker.name, broker.url, "race"]
            + [str(CLAIMERS)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    try:
        for p in procs:  # every process is connected before any claims
            line = await asyncio.to_thread(p.stdout.readline)
            assert line.strip() == "ready", line
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [(await asyncio.to_thread(p.communicate, timeout=90))[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs)
    rows = [json.loads(line) for out in outs for line in out.splitlines() if line]
    assert Counter(r[1] for r in rows).most_common(1)[0][1] == 1  # each job ran once
    assert len(rows) == len(jobs)
    for key, limit in keys.items():
        held = [(start, end) for k, _, start, end in rows if k == key]
        assert len(held) == 40
        assert max_overlap(held) <= limit, key
    assert await broker.key_stats() == []  # every slot came back


async def test_a_key_with_a_long_backlog_does_not_starve_a_small_one(broker):
    await broker.enqueue([keyed("big", 1000) for _ in range(1000)])
    await broker.enqueue([keyed("small", 1000) for _ in range(10)])
    # One job per claim, as a worker with one free slot claims: the keys take turns.
    one_by_one = [(await broker.claim(["default"], "w", 1))[0] for _ in range(20)]
    assert Counter(lease.payload["key"] for lease in one_by_one) == {"big": 10, "small": 10}
    await broker.enqueue([keyed("small", 1000) for _ in range(10)])
    # A batch: the first job of each key before the second of any.
    batch = await broker.claim(["default"], "w", 10)
    assert Counter(lease.payload["key"] for lease in batch) == {"big": 5, "small": 5}


async def test_claims_stop_at_the_limit_and_resume_as_slots_come_back(broker):
    await broker.enqueue([keyed("k", 2) for _ in range(5)] + [job()])
    first = await broker.claim(["default"], "w", 10)
    assert sorted(str(lease.payload) for lease in first).count("{'key': 'k'}") == 2
    assert len(first) == 3  # two of the key, and the job without one
    assert await broker.claim(["default"], "w", 10) == []
    assert await counts(broker, "k") == (2, 3)
    held = [lease for lease in first if lease.payload]
    # A completion gives one slot back; a retry another (the job waits again).
    assert await broker.complete_if_leased([Completion(held[0], 1)]) == [True]
    (nxt,) = await broker.claim(["default"], "w", 10)
    assert await broker.fail_if_leased(Failure(held[1], "boom")) == JobStatus.PENDING
    assert await counts(broker, "k") == (1, 3)
    (again,) = await broker.claim(["default"], "w", 10)
    assert await broker.claim(["default"], "w", 10) == []
    # A release (graceful stop, Snooze) too.
    assert await broker.release_if_leased([nxt]) == [nxt.job_id]
    assert await counts(broker, "k") == (1, 3)
    assert len(await broker.claim(["default"], "w", 10)) == 1
    assert await counts(broker, "k") == (2, 2)
    assert again.job_id != nxt.job_id


async def test_a_stale_holder_gives_no_slot_back_and_the_new_holder_does_once(broker):
    async def scenario(run: LeaseRun) -> None:
        q, qs = run.queue, [run.queue]
        k = f"k-{q}"
        await broker.enqueue([keyed(k, 1, queue=q, lease_seconds=run.lease), keyed(k, 1, queue=q)])
        (stale,) = await broker.claim(qs, "old", 5)

        async def fresh_claim():
            run.start()  # the fresh lease must hold to the end
            return await broker.claim(qs, "new", 5)

        (fresh,) = await eventually(fresh_claim, timeout=run.lease + 10)
        assert fresh.job_id == stale.job_id and fresh.token > stale.token  # the slot moved
        assert await counts(broker, k, q) == (1, 1)
        assert await broker.complete_if_leased([Completion(stale, "late")]) == [False]
        assert await broker.fail_if_leased(Failure(stale, "late")) is None
        assert await broker.release_if_leased([stale]) == []
        assert await counts(broker, k, q) == (1, 1)
        assert await broker.claim(qs, "other", 5) == []
        assert await broker.complete_if_leased([Completion(fresh, "ok")]) == [True]
        assert await broker.complete_if_leased([Completion(fresh, "ok")]) == [True]  # a retry
        assert await counts(broker, k, q) == (0, 1)
        (second,) = await broker.claim(qs, "other", 5)
        assert second.job_id != fresh.job_id
        assert await counts(broker, k, q) == (1, 0)

    await within_lease(scenario)


async def test_a_stall_that_dead_letters_the_job_gives_its_slot_back(broker):
    async def scenario(run: LeaseRun) -> None:
        q, qs = run.queue, [run.queue]
        k = f"k-{q}"
        stalling = keyed(k, 1, queue=q, lease_seconds=run.lease, max_stalls=1)
        (r, _) = await broker.enqueue([stalling, keyed(k, 1, queue=q)])
        (lease,) = await broker.claim(qs, "frozen", 5)
        assert lease.job_id == r.job_id
        # Its first stall is a takeover that keeps the slot; its second dead-letters it.
        wait = run.lease + 10
        (taken,) = await eventually(lambda: broker.claim(qs, "frozen too", 5), timeout=wait)
        assert taken.job_id == r.job_id and taken.stalls == 1
        assert await counts(broker, k, q) == (1, 1)

        async def second():
            run.start()  # the next job's lease must hold to the end
            return await broker.claim(qs, "w", 5)

        (nxt,) = await eventually(second, timeout=wait)
        assert nxt.job_id != r.job_id
        assert (await broker.get_job(r.job_id)).status == JobStatus.DEAD
        assert await counts(broker, k, q) == (1, 0)
        # Requeued from the dead-letter queue, it waits for its key's slot again.
        assert (await broker.requeue_dead([r.job_id])).requeued == [r.job_id]
        assert await counts(broker, k, q) == (1, 1)
        assert await broker.claim(qs, "w", 5) == []

    await within_lease(scenario)


async def test_stats_by_key_counts_running_and_waiting_busiest_first(broker):
    await broker.enqueue([keyed("a", 1) for _ in range(3)] + [keyed("b", 2) for _ in range(5)])
    await broker.enqueue([keyed("c", 3, queue="other")])
    await broker.enqueue([keyed("a", 1, delay=60)])  # delayed jobs wait too
    await broker.claim(["default", "other"], "w", 10)
    assert await broker.key_stats() == [
        KeyStats("default", "b", 2, 3, 2),
        KeyStats("default", "a", 1, 3, 1),
        KeyStats("other", "c", 1, 0, 3),
    ]
    assert await broker.key_stats(1) == [KeyStats("default", "b", 2, 3, 2)]
    assert await broker.claim(["default", "other"], "w", 10) == []


async def test_jobs_without_a_key_are_untouched_by_a_blocked_key(broker):
    await broker.enqueue([keyed("k", 1) for _ in range(3)])
    await broker.enqueue([job(payload={"i": i}) for i in range(3)])
    leases = await broker.claim(["default"], "w", 10)
    assert sorted(str(x.payload) for x in leases) == [
        "{'i': 0}",
        "{'i': 1}",
        "{'i': 2}",
        "{'key': 'k'}",
    ]
    (mine,) = [x for x in leases if x.payload == {"key": "k"}]
    assert (await broker.get_job(mine.job_id)).concurrency_key == "k"
    other = next(x for x in leases if x is not mine)
    assert (await broker.get_job(other.job_id)).concurrency_key is None


async def test_keyed_and_free_jobs_go_by_priority_then_age_neither_behind_the_other(broker):
    def ids(leases: list) -> list[object]:
        return [lease.payload["n"] for lease in leases]

    async def one_by_one(n: int) -> list[object]:
        return [ids(await broker.claim(["default"], "w", 1))[0] for _ in range(n)]

    # Free jobs older than a keyed backlog run first; a higher priority before both.
    await broker.enqueue([job(payload={"n": f"free{i}"}) for i in range(3)])
    await broker.enqueue([keyed("a", 100, payload={"n": f"a{i}"}) for i in range(3)])
    await broker.enqueue([keyed("a", 100, payload={"n": "top"}, priority=5)])
    assert await one_by_one(7) == ["top", "free0", "free1", "free2", "a0", "a1", "a2"]
    # And the other way round: an older keyed backlog before newer free jobs.
    await broker.enqueue([keyed("a", 100, payload={"n": f"a{i}"}) for i in range(3)])
    await broker.enqueue([job(payload={"n": f"free{i}"}) for i in range(3)])
    await broker.enqueue([job(payload={"n": "top"}, priority=5)])
    assert await one_by_one(7) == ["top", "a0", "a1", "a2", "free0", "free1", "free2"]
    # In one claim a free job counts as a key of its own: a key's first job by age,
    # then the free jobs, before the key's second.
    await broker.enqueue([keyed("a", 100, payload={"n": f"a{i}"}) for i in range(3)])
    await broker.enqueue([job(payload={"n": f"free{i}"}) for i in range(3)])
    batch = ids(await broker.claim(["default"], "w", 4))
    assert sorted(map(str, batch)) == ["a0", "free0", "free1", "free2"]


async def test_a_killed_workers_slot_comes_back_once_its_job_is_taken_over(broker, fleet):
    sleeper = {"seconds": 600}
    first, second = await broker.enqueue(
        [
            job("crash.sleep", sleeper, queue=QUEUE, concurrency_key="t", max_running_per_key=1)
            for _ in range(2)
        ]
    )
    (worker,) = fleet.start()

    async def running():
        j = await broker.get_job(first.job_id)
        mine = j.status == JobStatus.PROCESSING and f":{worker.pid}:" in j.lease_owner
        return j if mine else None

    held = await eventually(running, timeout=30)
    # The worker has three idle slots, and the key none: the second job waits.
    assert await counts(broker, "t", QUEUE) == (1, 1)
    assert (await broker.get_job(second.job_id)).status == JobStatus.PENDING
    fleet.kill(worker.pid)
    # Taken over at once: the job keeps the key's one slot, so nothing else runs.
    (rescued,) = await eventually(lambda: broker.claim([QUEUE], "rescuer", 5), timeout=10)
    assert rescued.job_id == first.job_id and rescued.token > held.lease_token
    assert await counts(broker, "t", QUEUE) == (1, 1)
    assert await broker.claim([QUEUE], "rescuer", 5) == []
    # Its end gives the slot back, once: the second job runs, and only it.
    assert await broker.complete_if_leased([Completion(rescued, "done")]) == [True]
    (nxt,) = await broker.claim([QUEUE], "rescuer", 5)
    assert nxt.job_id == second.job_id
    assert await counts(broker, "t", QUEUE) == (1, 0)
    assert await broker.complete_if_leased([Completion(nxt, "done")]) == [True]
    assert await broker.key_stats() == []
