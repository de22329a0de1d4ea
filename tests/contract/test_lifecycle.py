"""Contract: retries with backoff, dead letters, stalls, release, requeue, stats."""

from __future__ import annotations

from herd.queue.base import DeadReason, Failure, JobStatus, RequeueResult
from tests.helpers import eventually, job


async def test_failure_is_retried_after_its_backoff(broker):
    (r,) = await broker.enqueue([job(max_attempts=3)])
    (lease,) = await broker.claim(["default"], "w", 1)
    status = await broker.fail_if_leased(Failure(lease, "ValueError: x", "tb", retry_in=0.6))
    assert status == JobStatus.PENDING
    stored = await broker.get_job(r.job_id)
    assert stored.attempts == 1 and stored.last_error == "ValueError: x"
    assert await broker.claim(["default"], "w", 1) == []  # backing off
    (again,) = await eventually(lambda: broker.claim(["default"], "w", 1), timeout=5)
    assert again.job_id == r.job_id and again.attempts == 1 and again.token > lease.token


async def test_max_attempts_dead_letters_with_reason_error_traceback_and_worker(broker):
    (r,) = await broker.enqueue([job(max_attempts=2)])
    for n in range(2):
        (lease,) = await broker.claim(["default"], f"w{n}", 1)
        status = await broker.fail_if_leased(Failure(lease, f"boom {n}", f"tb {n}"))
    assert status == JobStatus.DEAD
    (dead,) = await broker.list_jobs(status=JobStatus.DEAD)
    assert dead.id == r.job_id
    assert dead.dead_reason == DeadReason.MAX_ATTEMPTS
    assert dead.attempts == 2
    assert dead.last_error == "boom 1" and dead.last_traceback == "tb 1"
    assert dead.last_worker == "w1"
    assert dead.finished_at is not None
    assert await broker.claim(["default"], "w", 1) == []


async def test_final_failure_skips_remaining_attempts(broker):
    await broker.enqueue([job(max_attempts=5)])
    (lease,) = await broker.claim(["default"], "w", 1)
    failure = Failure(lease, "unknown task", final=True, reason=DeadReason.UNKNOWN_TASK)
    assert await broker.fail_if_leased(failure) == JobStatus.DEAD
    (dead,) = await broker.list_jobs(status=JobStatus.DEAD)
    assert dead.dead_reason == "unknown_task" and dead.attempts == 1


async def test_stalls_are_counted_apart_from_errors(broker):
    (r,) = await broker.enqueue([job(lease_seconds=0.2, max_stalls=1, max_attempts=1)])
    await broker.claim(["default"], "w1", 1)
    (second,) = await eventually(lambda: broker.claim(["default"], "w2", 1), timeout=5)
    assert second.stalls == 1 and second.attempts == 0

    async def dead():
        await broker.claim(["default"], "w3", 1)
        stored = await broker.get_job(r.job_id)
        return stored if stored.status == JobStatus.DEAD else None

    stored = await eventually(dead, timeout=5)
    assert stored.dead_reason == DeadReason.MAX_STALLS
    assert stored.stalls == 2 and stored.attempts == 0
    assert "w2" in stored.last_error


async def test_release_gives_the_job_back_at_once_without_an_attempt(broker):
    (r,) = await broker.enqueue([job()])
    (lease,) = await broker.claim(["default"], "w1", 1)
    assert await broker.release_if_leased([lease]) == [r.job_id]
    (again,) = await broker.claim(["default"], "w2", 1)
    assert again.job_id == r.job_id
    assert again.attempts == 0 and again.stalls == 0 and again.token > lease.token


async def test_requeue_from_dead_letter_queue(broker):
    (a, b) = await broker.enqueue([job(max_attempts=1), job(max_attempts=1)])
    for _ in range(2):
        (lease,) = await broker.claim(["default"], "w", 1)
        await broker.fail_if_leased(Failure(lease, "boom"))
    assert len(await broker.list_jobs(status=JobStatus.DEAD)) == 2
    assert (await broker.requeue_dead([a.job_id])).requeued == [a.job_id]
    stored = await broker.get_job(a.job_id)
    assert (
        stored.status == JobStatus.PENDING and stored.attempts == 0 and stored.dead_reason is None
    )
    (lease,) = await broker.claim(["default"], "w", 1)
    assert lease.job_id == a.job_id
    assert (await broker.requeue_dead(None)).requeued == [b.job_id]
    assert await broker.requeue_dead([a.job_id]) == RequeueResult([], [])  # not dead


async def test_stats_count_jobs_by_queue_and_status(broker):
    await broker.enqueue([job(queue="q1"), job(queue="q1"), job(queue="q2", delay=60)])
    await broker.claim(["q1"], "w", 1)
    stats = {s.queue: s for s in await broker.stats()}
    assert stats["q1"].counts == {JobStatus.PENDING: 1, JobStatus.PROCESSING: 1}
    assert stats["q1"].ready == 1
    assert stats["q2"].counts == {JobStatus.PENDING: 1} and stats["q2"].ready == 0
