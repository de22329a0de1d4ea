"""`herd schedule …` as a user runs it, with no app: the store keeps the schedules."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from herd import App
from herd.schedule import ops
from herd.schedule.model import Schedule
from herd.schedule.ticker import Ticker
from tests.test_cli import herd


async def test_list_pause_resume_run_now_remove_and_an_unknown_name(pg_url):
    name = f"cli-{uuid.uuid4().hex[:8]}"
    app = App(database_url=pg_url)
    app.add_schedule(Schedule(name, "reindex", queue="nightly", every=3600))
    async with app:
        await Ticker(app, clock=lambda: datetime(2026, 12, 3, 12, 30, tzinfo=UTC)).register()

    def listed() -> dict:
        r = herd("schedule", "list", "--json", url=pg_url)
        assert r.returncode == 0, r.stderr
        return {v["name"]: v for v in map(json.loads, r.stdout.splitlines())}[name]

    v = listed()
    assert (v["when"], v["paused"], v["next_run"]) == (
        "every 3600s",
        False,
        "2026-12-03T13:00:00+00:00",
    )
    assert herd("schedule", "pause", name, url=pg_url).stdout == f"paused {name}\n"
    assert listed()["paused"] is True
    r = herd("schedule", "run-now", name, "--json", url=pg_url)
    job_id = json.loads(r.stdout)["job_id"]
    v = listed()
    assert (v["last_job_id"], v["last_outcome"], v["runs"]) == (job_id, "pending", 1)
    r = herd("schedule", "resume", name, url=pg_url)
    assert r.returncode == 0 and r.stdout.startswith(f"resumed {name}: next run ")
    assert listed()["paused"] is False

    r = herd("schedule", "pause", "no-such-schedule", url=pg_url)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "no schedule is named 'no-such-schedule'" in r.stderr

    # The table reads as the other listings do: no box, within 80 columns.
    r = herd("schedule", "list", url=pg_url)
    assert r.returncode == 0 and name in r.stdout, r.stderr
    assert not set("┃━┏└…") & set(r.stdout), r.stdout  # nothing boxed or cut short

    # One no app defines any more is forgotten; a second remove finds nothing.
    r = herd("schedule", "remove", name, url=pg_url)
    assert (r.returncode, r.stdout) == (0, f"removed {name}\n"), r.stderr
    r = herd("schedule", "list", "--json", url=pg_url)
    assert name not in {json.loads(line)["name"] for line in r.stdout.splitlines()}
    r = herd("schedule", "remove", name, url=pg_url)
    assert r.returncode == 1 and f"no schedule is named {name!r}" in r.stderr


async def test_run_now_without_the_app_takes_the_tasks_lease_not_the_default(pg_url):
    name = f"cli-{uuid.uuid4().hex[:8]}"
    app = App(database_url=pg_url)

    @app.task(name="slow-reindex", queue="nightly", lease_seconds=900, max_attempts=7)
    async def slow_reindex(payload: object) -> None: ...

    app.add_schedule(Schedule(name, "slow-reindex", queue="nightly", every=3600))
    async with app:
        await Ticker(app).register()
        first = await ops.run_now(app, name)  # as a worker's tick: the app defines the task
        r = herd("schedule", "run-now", name, "--json", url=pg_url)
        assert r.returncode == 0, r.stderr
        second = json.loads(r.stdout)["job_id"]
        jobs = {j.id: j for j in await app.broker.get_jobs([first, second])}
    assert {(j.lease_seconds, j.max_attempts) for j in jobs.values()} == {(900, 7)}
