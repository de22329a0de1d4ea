"""Real worker processes: one SIGKILLed mid-job, one SIGSTOPped past its lease (every backend).

Every job must end completed exactly once, none lost, and the frozen worker's
late writes must be refused.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from herd import App, JobStatus
from herd.testing.fleet import Fleet, herd_worker, wait_until, worker_env
from tests.apps.crashapp import SCHEMA, app

ROOT = Path(__file__).resolve().parent.parent
JOBS = 40


def _fleet(broker, logs: Path) -> Fleet:
    url = "database_url" if broker.name == "postgres" else "redis_url"
    env = worker_env(broker=broker.name, pythonpath=[ROOT], **{url: broker.url})
    argv = herd_worker("tests.apps.crashapp:app", "--concurrency", "3", "--poll-interval", "0.2",
                       "--grace", "10")  # fmt: skip
    return Fleet(argv, env, logs=logs, cwd=ROOT)


@pytest.mark.timeout(180)
async def test_sigkill_and_sigstop_lose_nothing_and_accept_no_stale_write(broker, tmp_path):
    if broker.name == "postgres":
        with psycopg.connect(broker.url, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS crash_effects")
            conn.execute(SCHEMA)
    # The producer's registry supplies the task's policy (1.5 s leases).
    producer = App(broker=broker)
    producer.include(app)
    ids = [r.job_id for r in await producer.enqueue_many(
        "crash.sleep", [{"seconds": 0.4 + (i % 5) * 0.2} for i in range(JOBS)])]  # fmt: skip

    async def held_by(pid: int) -> list:
        jobs = await broker.list_jobs(status=JobStatus.PROCESSING)
        return [j for j in jobs if j.lease_owner and f":{pid}:" in j.lease_owner]

    with _fleet(broker, tmp_path) as fleet:
        killed, frozen, healthy = fleet.start(3)
        # SIGKILL a worker in the middle of its jobs.
        await wait_until(lambda: held_by(killed.pid), 30, what="a job held by the victim")
        fleet.kill(killed.pid)

        # Freeze another one past its lease; wait until its job is done by someone else.
        stolen = (await wait_until(lambda: held_by(frozen.pid), 30, what="a job to freeze"))[0]
        fleet.freeze(frozen.pid)

        async def taken_over_and_done() -> bool:
            job = await broker.get_job(stolen.id)
            return job.status == JobStatus.SUCCEEDED and job.lease_token > stolen.lease_token

        await wait_until(taken_over_and_done, 60)
        fleet.thaw(frozen.pid)

        async def all_done() -> bool:
            done = await broker.list_jobs(status=JobStatus.SUCCEEDED, limit=JOBS)
            return len(done) == JOBS

        await wait_until(all_done, 90, interval=0.1)

        # The resumed worker notices its lost lease and writes nothing.
        def noticed() -> bool:
            return f"job {stolen.id}: lease lost" in frozen.log.read_text()

        await wait_until(noticed, 20)
        assert fleet.stop(pids=[frozen.pid, healthy.pid]) == [0, 0]

    jobs = [await broker.get_job(i) for i in ids]
    assert all(j is not None for j in jobs)  # none lost
    for j in jobs:
        assert j.status == JobStatus.SUCCEEDED, j.id
        # The accepted result comes from the final lease: no stale write was accepted.
        assert j.result["token"] == j.lease_token, j.id
    final = next(j for j in jobs if j.id == stolen.id)
    assert final.result["pid"] != frozen.pid and final.lease_token > stolen.lease_token
    assert sum(j.stalls for j in jobs) >= 2  # the killed and the frozen worker's jobs

    if broker.name == "postgres":  # the fenced side effect agrees with the accepted result
        with psycopg.connect(broker.url) as conn:
            effects = dict(conn.execute("SELECT job_id, token FROM crash_effects").fetchall())
        assert effects == {j.id: j.lease_token for j in jobs}
