"""Contract: requeueing dead letters skips (and reports) jobs whose dedup key is held."""

from __future__ import annotations

from herd.queue.base import DeadReason, DedupConflict, Failure, JobStatus
from tests.helpers import job


async def dead(broker, n=1, **kw):
    """``n`` dead-lettered jobs (enqueued and failed one by one, so keys may repeat)."""
    ids = []
    for _ in range(n):
        (r,) = await broker.enqueue([job(**kw)])
        (lease,) = await broker.claim([kw.get("queue", "default")], "w", 1)
        assert lease.job_id == r.job_id
        await broker.fail_if_leased(Failure(lease, "boom", final=True, reason=DeadReason.FATAL))
        ids.append(r.job_id)
    return ids


async def test_requeue_all_skips_jobs_whose_key_is_held_and_requeues_the_rest(broker):
    (plain,) = await dead(broker)
    (held,) = await dead(broker, dedup_key="k1")
    (other_queue,) = await dead(broker, queue="q2", dedup_key="k2")
    (free,) = await dead(broker, dedup_key="k3")
    (holder,) = await broker.enqueue([job(dedup_key="k1")])
    (holder2,) = await broker.enqueue([job(queue="q2", dedup_key="k2")])
    result = await broker.requeue_dead(None)
    assert result.requeued == [plain, free]
    # By job id (ids of two queues need not follow the order they were made in).
    assert result.skipped == sorted(
        [
            DedupConflict(held, "k1", holder.job_id),
            DedupConflict(other_queue, "k2", holder2.job_id),
        ],
        key=lambda c: c.job_id,
    )
    assert (await broker.get_job(held)).status == JobStatus.DEAD
    assert (await broker.get_job(other_queue)).status == JobStatus.DEAD
    assert (await broker.get_job(free)).status == JobStatus.PENDING
    # Requeued keys are held again: a new job with one is deduplicated onto it.
    (again,) = await broker.enqueue([job(dedup_key="k3")])
    assert not again.created and again.job_id == free


async def test_requeue_of_listed_ids_skips_a_held_key_and_requeues_the_others(broker):
    held, plain = (await dead(broker, dedup_key="k"))[0], (await dead(broker))[0]
    (holder,) = await broker.enqueue([job(dedup_key="k")])
    result = await broker.requeue_dead([held, plain, 987_654])
    assert result.requeued == [plain]
    assert result.skipped == [DedupConflict(held, "k", holder.job_id)]


async def test_of_dead_jobs_sharing_a_free_key_the_oldest_is_requeued_and_holds_it(broker):
    first, second = await dead(broker, n=2, dedup_key="same")
    for ids in ([second, first], None):
        result = await broker.requeue_dead(ids)
        if ids is not None:
            assert result.requeued == [first]
            assert result.skipped == [DedupConflict(second, "same", first)]
        else:  # first is pending now: second is still skipped, held by it
            assert result.requeued == []
            assert result.skipped == [DedupConflict(second, "same", first)]


async def test_requeue_all_picks_the_lowest_id_of_a_free_key_whatever_the_order_of_death(broker):
    first, second = await dead(broker, n=2, dedup_key="same")
    assert (await broker.requeue_dead([first])).requeued == [first]
    (lease,) = await broker.claim(["default"], "w", 1)
    await broker.fail_if_leased(Failure(lease, "again", final=True, reason=DeadReason.FATAL))
    # first died last now; the lowest id still wins the key
    result = await broker.requeue_dead(None)
    assert result.requeued == [first]
    assert result.skipped == [DedupConflict(second, "same", first)]
