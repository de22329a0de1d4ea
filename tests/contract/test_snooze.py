"""Contract: a snooze (release with a delay) and reschedule move jobs in time without
counting an attempt or a stall; reschedule touches pending jobs only; counts stay exact."""

from __future__ import annotations

import asyncio

import pytest

from herd import App, JobStatus, Snooze, Worker
from herd.queue.base import DeadReason, Failure
from tests.contract.test_counts import full_count, stat_counts
from tests.helpers import eventually, job


async def test_a_snoozed_job_keeps_its_counters_and_is_due_only_after_the_delay(broker):
    (r,) = await broker.enqueue([job()])
    (lease,) = await broker.claim(["default"], "w1", 1)
    assert await broker.release_if_leased([lease], delay=0.6) == [r.job_id]
    stored = await broker.get_job(r.job_id)
    assert stored.status == JobStatus.PENDING and stored.attempts == 0 and stored.stalls == 0
    assert await broker.claim(["default"], "w2", 1) == []  # not before the delay
    assert await stat_counts(broker) == await full_count(broker) == {("default", "pending"): 1}

    async def claimed():
        return await broker.claim(["default"], "w2", 1)

    (again,) = await eventually(claimed, timeout=5)
    assert again.job_id == r.job_id and again.attempts == 0 and again.stalls == 0
    assert again.token > lease.token
    assert await broker.release_if_leased([lease], delay=5) == []  # a stale lease snoozes nothing


async def test_reschedule_moves_only_pending_jobs_and_back(broker):
    made = await broker.enqueue([job() for _ in range(4)])
    ids = [m.job_id for m in made]
    (running,) = await broker.claim(["default"], "w", 1)
    (doomed,) = await broker.claim(["default"], "w", 1)
    await broker.fail_if_leased(Failure(doomed, "no", final=True, reason=DeadReason.FATAL))
    pending = sorted(set(ids) - {running.job_id, doomed.job_id})
    assert await broker.reschedule(ids + [10**9], 3600) == pending  # unknown ids: ignored
    assert await broker.claim(["default"], "w", 5) == []  # parked out of reach
    (stats,) = await broker.stats()
    assert stats.ready == 0 and stats.counts[JobStatus.PENDING] == 2
    assert await stat_counts(broker) == await full_count(broker)
    assert (await broker.get_job(running.job_id)).status == JobStatus.PROCESSING
    assert (await broker.get_job(doomed.job_id)).status == JobStatus.DEAD
    assert await broker.reschedule(pending, 0) == pending
    back = await broker.claim(["default"], "w", 5)
    assert sorted(lease.job_id for lease in back) == pending
    assert all(lease.attempts == 0 for lease in back)
    assert await stat_counts(broker) == await full_count(broker)
    assert await broker.reschedule([], 0) == []


@pytest.mark.parametrize("broker", ["postgres", "redis"], indirect=True)
async def test_a_task_raising_snooze_runs_again_later_with_no_attempt(broker):
    app = App(broker=broker)
    runs: list[int] = []
    again = asyncio.Event()

    @app.task(name="snoozy", max_attempts=1)
    async def snoozy(payload, ctx):
        runs.append(ctx.lease.attempts)
        if len(runs) == 1:
            raise Snooze("not yet", after=0.5)
        again.set()
        return "ok"

    r = await app.enqueue("snoozy")
    worker = Worker(app, concurrency=2, poll_interval=0.1, install_signal_handlers=False)
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(again.wait(), 10)

    async def succeeded():
        j = await broker.get_job(r.job_id)
        return j if j.status == JobStatus.SUCCEEDED else None

    stored = await eventually(succeeded)
    worker.stop()
    stats = await run
    # max_attempts=1: a counted attempt would have dead-lettered it instead
    assert runs == [0, 0] and stored.attempts == 0 and stored.result == "ok"
    assert stats.snoozed == 1 and stats.retried == 0 and stats.dead == 0
