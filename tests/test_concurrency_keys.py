"""Concurrency keys through the App and the CLI: the task's limit, bad input, the
per-key statistics at 80 columns (the bound itself: tests/contract)."""

from __future__ import annotations

import asyncio
import json

import pytest

from herd import App, Worker
from herd.errors import InvalidInput
from herd.queue.base import JobStatus
from tests.helpers import eventually
from tests.test_cli import herd


async def test_a_keyed_job_takes_its_tasks_limit_unless_the_producer_gives_one(clean_pg):
    app = App(database_url=clean_pg)

    @app.task(name="per.tenant", max_running_per_key=3)
    def per_tenant(payload: object) -> None: ...

    async with app:
        await app.enqueue_many(per_tenant, [{}] * 5, concurrency_keys=["a"] * 4 + [None])
        assert len(await app.broker.claim(["default"], "w", 10)) == 4  # 3 of "a", the other
        await app.enqueue("per.tenant", {}, concurrency_key="b", max_running_per_key=1)
        await app.enqueue("per.tenant", {}, concurrency_key="b", max_running_per_key=1)
        assert len(await app.broker.claim(["default"], "w", 10)) == 1
        stats = {(k.key, k.running, k.waiting, k.max_running) for k in await app.key_stats()}
        assert stats == {("a", 3, 1, 3), ("b", 1, 1, 1)}


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"concurrency_key": ""}, "concurrency_key"),
        ({"concurrency_key": "x" * 201}, "concurrency_key"),
        ({"concurrency_key": "k", "max_running_per_key": 0}, "max_running_per_key"),
        ({"concurrency_key": "k", "max_running_per_key": True}, "max_running_per_key"),
    ],
)
async def test_bad_keys_and_limits_are_refused_before_anything_is_stored(clean_pg, kw, field):
    async with App(database_url=clean_pg) as app:
        with pytest.raises(InvalidInput) as err:
            await app.enqueue("t", {}, **kw)
        assert err.value.field == field
        assert await app.list_jobs() == []


def test_a_task_limit_below_one_is_refused_at_definition():
    app = App(database_url="postgresql://unused/none")
    with pytest.raises(ValueError, match="max_running_per_key"):
        app.task(name="t", max_running_per_key=0)(lambda payload: None)


def test_stats_by_key_from_the_command_line_at_80_columns(clean_pg):
    tenant = "tenant:a-long-customer-name-that-goes-on-and-on-for-a-while-longer-still"
    for key in [tenant, tenant, "tenant:b"]:
        r = herd(
            "enqueue", "t", "{}", "--concurrency-key", key, "--max-running-per-key", "2",
            url=clean_pg,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
    shown = herd("jobs", "stats", "--by-key", url=clean_pg, COLUMNS="80")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].rstrip() == "busiest 2 keys"
    assert all(len(line) <= 80 for line in lines)
    assert "running" in lines[1] and "waiting" in lines[1] and "limit" in lines[1]
    assert "…" not in shown.stdout and "longer-still" in shown.stdout  # folded, never cut
    rows = [json.loads(x) for x in herd("jobs", "stats", "--by-key", "--json", "--top", "1",
                                        url=clean_pg).stdout.splitlines()]  # fmt: skip
    assert rows == [
        {"queue": "default", "key": tenant, "running": 0, "waiting": 2, "max_running": 2}
    ]
    bad = herd("enqueue", "t", "{}", "--concurrency-key", "k", "--max-running-per-key", "0")
    assert bad.returncode == 2 and "max-running-per-key" in bad.stderr


def test_a_key_at_the_highest_limit_reads_as_no_limit(clean_pg):
    # An evaluation batch's jobs carry such a key: it gives them turns, it bounds nothing.
    r = herd("enqueue", "t", "{}", "--concurrency-key", "batch:nightly",
             "--max-running-per-key", "1000000", url=clean_pg)  # fmt: skip
    assert r.returncode == 0, r.stderr
    shown = herd("jobs", "stats", "--by-key", url=clean_pg, COLUMNS="80")
    (row,) = [line.split() for line in shown.stdout.splitlines() if "batch:nightly" in line]
    assert row == ["default", "batch:nightly", "0", "none", "1"]
    listed = herd("jobs", "stats", "--by-key", "--json", url=clean_pg)
    assert json.loads(listed.stdout)["max_running"] is None  # not a million


def test_stats_by_key_says_so_when_no_key_has_work(clean_pg):
    shown = herd("jobs", "stats", "--by-key", url=clean_pg)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "no job with a concurrency key is running or waiting\n"


async def test_a_worker_claims_again_as_soon_as_its_keyed_job_frees_the_key(clean_pg):
    # Polls come 60 s or more apart: only the freed key can have woken the worker.
    app = App(database_url=clean_pg)

    @app.task(name="one.at.a.time", max_running_per_key=1)
    def one(payload: object) -> None: ...

    async with app:
        ids = [r.job_id for r in await app.enqueue_many(one, [{}] * 3, concurrency_keys=["k"] * 3)]
        worker = Worker(app, concurrency=4, poll_interval=120, install_signal_handlers=False)
        running = asyncio.create_task(worker.run())
        try:

            async def all_done() -> bool:
                jobs = await app.broker.get_jobs(ids)
                return all(j.status == JobStatus.SUCCEEDED for j in jobs) or None  # type: ignore[return-value]

            assert await eventually(all_done, timeout=30)
        finally:
            worker.stop()
            await running
