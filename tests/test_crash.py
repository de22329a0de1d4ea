"""Real worker processes: one SIGKILLed mid-job, one SIGSTOPped past its lease.

Every job must end completed exactly once, none lost, and the frozen worker's
late writes must be refused.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from herd import JobStatus
from tests.apps.crashapp import SCHEMA, app
from tests.helpers import eventually_sync

ROOT = Path(__file__).resolve().parent.parent
JOBS = 40


def _spawn(url: str, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, HERD_DATABASE_URL=url, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "herd",
            "worker",
            "tests.apps.crashapp:app",
            "--concurrency",
            "3",
            "--poll-interval",
            "0.2",
            "--grace",
            "10",
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )


def _held_by(conn: psycopg.Connection, pid: int) -> list[tuple[int, int]]:
    return conn.execute(
        "SELECT id, lease_token FROM herd_jobs WHERE status = 'processing'"
        " AND lease_owner LIKE %s AND lease_expires_at > now() ORDER BY id",
        (f"%:{pid}:%",),
    ).fetchall()


@pytest.mark.timeout(180)
def test_sigkill_and_sigstop_lose_nothing_and_accept_no_stale_write(clean_pg, tmp_path):
    url = clean_pg
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS crash_effects")
        conn.execute(SCHEMA)

    async def submit() -> list[int]:
        # The producer's registry supplies the task's policy (1.5 s leases).
        app.settings = app.settings.override(database_url=url)
        async with app:
            res = await app.enqueue_many(
                "crash.sleep", [{"seconds": 0.4 + (i % 5) * 0.2} for i in range(JOBS)]
            )
            return [r.job_id for r in res]

    ids = asyncio.run(submit())
    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    procs = [_spawn(url, log) for log in logs]
    killed, frozen, healthy = procs
    conn = psycopg.connect(url, autocommit=True)
    try:
        # SIGKILL a worker in the middle of its jobs.
        eventually_sync(lambda: _held_by(conn, killed.pid), timeout=30)
        killed.send_signal(signal.SIGKILL)
        killed.wait()

        # Freeze another one past its lease; wait until its job is done by someone else.
        held = eventually_sync(lambda: _held_by(conn, frozen.pid), timeout=30)
        frozen.send_signal(signal.SIGSTOP)
        stolen_id, stolen_token = held[0]

        def taken_over_and_done() -> bool:
            row = conn.execute(
                "SELECT status, lease_token FROM herd_jobs WHERE id = %s", (stolen_id,)
            ).fetchone()
            return row[0] == "succeeded" and row[1] > stolen_token

        eventually_sync(taken_over_and_done, timeout=60)
        frozen.send_signal(signal.SIGCONT)

        def all_done() -> bool:
            n = conn.execute(
                "SELECT count(*) FROM herd_jobs WHERE status = 'succeeded'"
            ).fetchone()[0]
            return n == JOBS

        eventually_sync(all_done, timeout=90, interval=0.1)
        # The resumed worker notices its lost lease and writes nothing.
        eventually_sync(lambda: f"job {stolen_id}: lease lost" in logs[1].read_text(), timeout=20)

        for p in (frozen, healthy):
            p.send_signal(signal.SIGTERM)
        assert [p.wait(timeout=30) for p in (frozen, healthy)] == [0, 0]

        rows = conn.execute(
            "SELECT j.id, j.status, j.lease_token, j.result, e.token, e.pid"
            " FROM herd_jobs j LEFT JOIN crash_effects e ON e.job_id = j.id ORDER BY j.id"
        ).fetchall()
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
        conn.close()

    assert [r[0] for r in rows] == ids  # none lost, none invented
    for job_id, status, token, result, effect_token, effect_pid in rows:
        assert status == JobStatus.SUCCEEDED, job_id
        # The accepted result and the fenced side effect both come from the final lease.
        assert effect_token == token == result["token"], job_id
        assert effect_pid == result["pid"], job_id
    stolen = next(r for r in rows if r[0] == stolen_id)
    assert stolen[3]["pid"] != frozen.pid
    assert stolen[2] > stolen_token
