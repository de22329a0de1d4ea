"""Contract: the read-only verbs dashboards use (running jobs, throughput per minute)."""

from __future__ import annotations

from herd.queue.base import Completion, DeadReason, Failure
from tests.helpers import eventually, job


async def test_running_lists_leased_jobs_soonest_expiry_first_with_time_left(broker):
    await broker.enqueue([job(task="long", lease_seconds=60), job(task="short", lease_seconds=20)])
    await broker.enqueue([job(task="waiting")])
    leases = await broker.claim(["default"], "w1", 2)
    running = await broker.running()
    assert [r.task for r in running] == ["short", "long"]
    short = running[0]
    assert short.owner == "w1" and short.queue == "default" and short.attempts == 0
    assert 15 < short.lease_left <= 20 and short.lease_seconds == 20
    assert short.lease_expires_at.tzinfo is not None
    assert len(await broker.running(limit=1)) == 1
    await broker.complete_if_leased([Completion(lease, None) for lease in leases])
    assert await broker.running() == []


async def test_running_shows_an_expired_lease_as_negative_time_left(broker):
    await broker.enqueue([job(lease_seconds=0.2)])
    await broker.claim(["default"], "w", 1)

    async def expired():
        (r,) = await broker.running()
        return r.lease_left < 0

    await eventually(expired, timeout=5)


async def test_throughput_counts_succeeded_and_dead_jobs_per_minute_per_queue(broker):
    empty = await broker.throughput(5)
    assert empty.minutes == 5 and empty.succeeded == {} and empty.dead == {}
    assert empty.start.second == 0 and empty.start.microsecond == 0
    await broker.enqueue([job(queue="a") for _ in range(3)] + [job(queue="b")])
    done = await broker.claim(["a"], "w", 3)
    await broker.complete_if_leased([Completion(lease, {"ok": 1}) for lease in done[:2]])
    await broker.fail_if_leased(Failure(done[2], "x", final=True, reason=DeadReason.FATAL))
    tp = await broker.throughput(5)
    assert len(tp.succeeded["a"]) == 5
    # The finish may fall in the minute before the read: sum the window.
    assert sum(tp.succeeded["a"]) == 2 and sum(tp.dead["a"]) == 1
    assert "b" not in tp.succeeded
    assert sum(tp.succeeded["a"][-2:]) == 2


async def test_get_jobs_returns_the_existing_jobs_of_several_queues_in_one_call(broker):
    made = await broker.enqueue(
        [job(task="a", payload={"n": 1}), job(task="b", queue="other", payload={"n": 2})]
    )
    ids = [m.job_id for m in made]
    found = await broker.get_jobs([ids[1], 987_654_321, ids[0]])
    assert sorted((j.id, j.task, j.queue, j.payload["n"]) for j in found) == [
        (ids[0], "a", "default", 1),
        (ids[1], "b", "other", 2),
    ]
    assert await broker.get_jobs([]) == []
