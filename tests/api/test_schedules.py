"""The schedules' routes and the overview's section (each broker): list with next and
last run, pause, resume, run-now; an unknown name is a 404 in herd's shape."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from herd.schedule.model import Schedule
from herd.schedule.ticker import Ticker


async def test_schedules_are_listed_paused_resumed_and_run_now(any_app, any_client):
    name = f"nightly-{uuid.uuid4().hex[:8]}"
    any_app.add_schedule(Schedule(name, "reindex", queue="nightly", cron="0 2 * * *",
                                  timezone="Asia/Jakarta"))  # fmt: skip
    await Ticker(any_app, clock=lambda: datetime(2026, 12, 3, 12, tzinfo=UTC)).register()

    listed = {s["name"]: s for s in (await any_client.get("/schedules")).json()}
    s = listed[name]
    assert (s["when"], s["paused"], s["runs"]) == ("0 2 * * * (Asia/Jakarta)", False, 0)
    assert s["next_run"] == "2026-12-03T19:00:00Z" and s["last_outcome"] is None

    r = await any_client.post(f"/schedules/{name}/pause")
    assert r.status_code == 200 and r.json()["paused"] is True
    assert r.json()["next_run"] is None  # no tick fires while paused
    ov = (await any_client.get("/overview")).json()
    assert {x["name"]: x["paused"] for x in ov["schedules"]}[name] is True

    r = await any_client.post(f"/schedules/{name}/run-now")
    assert r.status_code == 200, r.text
    job_id = r.json()["job_id"]
    job = (await any_client.get(f"/jobs/{job_id}")).json()
    assert (job["task"], job["queue"]) == ("reindex", "nightly")
    assert job["payload"] == {"schedule": name, "tick": None}
    s = {x["name"]: x for x in (await any_client.get("/schedules")).json()}[name]
    assert (s["last_job_id"], s["last_outcome"], s["runs"]) == (job_id, "pending", 1)

    r = await any_client.post(f"/schedules/{name}/resume")
    assert r.status_code == 200 and r.json()["paused"] is False


async def test_a_removed_schedule_is_listed_no_more(any_app, any_client):
    name = f"retired-{uuid.uuid4().hex[:8]}"
    any_app.add_schedule(Schedule(name, "reindex", queue="nightly", every=3600))
    await Ticker(any_app, clock=lambda: datetime(2026, 12, 3, 12, tzinfo=UTC)).register()
    r = await any_client.delete(f"/schedules/{name}")
    assert r.status_code == 200, r.text
    assert (r.json()["name"], r.json()["when"]) == (name, "every 3600s")  # what it was
    assert name not in {s["name"] for s in (await any_client.get("/schedules")).json()}
    r = await any_client.post(f"/schedules/{name}/run-now")  # nothing left to run
    assert r.status_code == 404, r.text
    r = await any_client.delete(f"/schedules/{name}")
    assert r.status_code == 404 and "no schedule is named" in r.json()["error"]


async def test_an_unknown_schedule_is_a_404(any_client):
    for verb in ("pause", "resume", "run-now"):
        r = await any_client.post(f"/schedules/no-such-{verb}/{verb}")
        assert r.status_code == 404, r.text
        assert "no schedule is named" in r.json()["error"]
