"""Real worker processes: one SIGKILLed mid-job, one SIGSTOPped past its lease (every backend).

Every job must end completed exactly once, none lost, and the frozen worker's
late writes must be refused.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from herd import App, JobStatus
from tests.apps.crashapp import SCHEMA, app
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parent.parent
JOBS = 40


def _spawn(broker, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HERD_BROKER=broker.name)
    env["HERD_DATABASE_URL" if broker.name == "postgres" else "HERD_REDIS_URL"] = broker.url
    return subprocess.Popen(
        [sys.executable, "-m", "herd", "worker", "tests.apps.crashapp:app", "--concurrency", "3",
         "--poll-interval", "0.2", "--grace", "10"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip


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

    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    procs = [_spawn(broker, log) for log in logs]
    killed, frozen, healthy = procs
    try:
        # SIGKILL a worker in the middle of its jobs.
        await eventually(lambda: held_by(killed.pid), timeout=30)
        killed.send_signal(signal.SIGKILL)
        killed.wait()

        # Freeze another one past its lease; wait until its job is done by someone else.
        stolen = (await eventually(lambda: held_by(frozen.pid), timeout=30))[0]
        frozen.send_signal(signal.SIGSTOP)

        async def taken_over_and_done() -> bool:
            job = await broker.get_job(stolen.id)
            return job.status == JobStatus.SUCCEEDED and job.lease_token > stolen.lease_token

        await eventually(taken_over_and_done, timeout=60)
        frozen.send_signal(signal.SIGCONT)

        async def all_done() -> bool:
            done = await broker.list_jobs(status=JobStatus.SUCCEEDED, limit=JOBS)
            return len(done) == JOBS

        await eventually(all_done, timeout=90, interval=0.1)

        # The resumed worker notices its lost lease and writes nothing.
        async def noticed() -> bool:
            return f"job {stolen.id}: lease lost" in logs[1].read_text()

        await eventually(noticed, timeout=20)
        for p in (frozen, healthy):
            p.send_signal(signal.SIGTERM)
        assert [p.wait(timeout=30) for p in (frozen, healthy)] == [0, 0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()

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
