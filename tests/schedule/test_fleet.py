"""Real `herd worker` processes fire a schedule of every second, and are SIGKILLed
across its ticks, all of them at once too (every backend): each tick from the first
to the last makes exactly one job, none twice, none lost (catch_up back-fills the
ticks missed while no worker ran)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from herd.testing.fleet import Fleet, herd_worker, wait_until, worker_env

ROOT = Path(__file__).resolve().parent.parent.parent


def _fleet(broker, name: str, logs: Path) -> Fleet:
    url = "database_url" if broker.name == "postgres" else "redis_url"
    env = worker_env(broker=broker.name, pythonpath=[ROOT], SCHED_NAME=name,
                     **{url: broker.url})  # fmt: skip
    argv = herd_worker("tests.apps.schedapp:app", "--queue", "sched", "--concurrency", "2",
                       "--poll-interval", "0.2", "--grace", "5")  # fmt: skip
    return Fleet(argv, env, logs=logs, cwd=ROOT)


@pytest.mark.timeout(240)
async def test_killed_workers_still_give_one_job_per_tick(broker, tmp_path):
    name = f"fleet-{uuid.uuid4().hex[:8]}"

    async def runs() -> int:
        found = await broker.schedules([name])
        return found[0].runs if found else 0

    def more_runs_than(n: int):
        async def probe() -> int:
            return (r := await runs()) > n and r

        return probe

    with _fleet(broker, name, tmp_path) as fleet:
        first, second = fleet.start(2)
        done = await wait_until(more_runs_than(2), 60, what="three runs")
        fleet.kill(first.pid)
        fleet.start(1)
        done = await wait_until(more_runs_than(done + 2), 60, what="runs after a kill")
        # Every worker gone at once: ticks pass with nobody to fire them.
        for member in fleet.running:
            fleet.kill(member.pid)
        (state,) = await broker.schedules([name])
        gone_since = state.last_tick
        await wait_until(lambda: datetime.now(UTC) > gone_since + timedelta(seconds=3), 10)
        restarted = fleet.start(2)
        # The missed ticks come back as one back-filled firing, then the ticks go on.
        await wait_until(more_runs_than(done + 5), 60, what="runs after the restart")
        await wait_until(lambda: all("queues sched" in m.log.read_text() for m in restarted), 60)
        assert fleet.stop() == [0, 0]

    (state,) = await broker.schedules([name])
    jobs = await broker.list_jobs(queue="sched", limit=5000)
    ticks = sorted(datetime.fromisoformat(j.payload["tick"]) for j in jobs
                   if j.payload["schedule"] == name)  # fmt: skip
    assert len(ticks) == len(set(ticks)) == state.runs  # none twice
    span = int((ticks[-1] - ticks[0]).total_seconds())
    assert ticks == [ticks[0] + timedelta(seconds=i) for i in range(span + 1)]  # none lost
    assert ticks[-1] == state.last_tick
