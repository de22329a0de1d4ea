"""Contract: stats() is exact through every change of a job, purges included, and
the throughput rollup outlives the jobs it counted; dead letters go only when purged."""

from __future__ import annotations

from collections import Counter

from herd.queue.base import Completion, DeadReason, Failure, JobStatus
from tests.helpers import eventually, job


async def full_count(broker) -> dict[tuple[str, str], int]:
    """Every job the broker holds, counted one by one (what stats() must not do)."""
    jobs = await broker.list_jobs(limit=100_000)
    return dict(Counter((j.queue, j.status.value) for j in jobs))


async def stat_counts(broker) -> dict[tuple[str, str], int]:
    return {(s.queue, st.value): n for s in await broker.stats() for st, n in s.counts.items()}


async def test_stats_equal_a_full_count_through_every_kind_of_change(broker):
    made = await broker.enqueue(
        [job(queue="a", dedup_key=f"k{i}", lease_seconds=0.3 if i < 2 else 30) for i in range(8)]
        + [job(queue="b") for _ in range(3)]
    )
    (dup,) = await broker.enqueue([job(queue="a", dedup_key="k0")])  # counts nothing
    assert dup.job_id == made[0].job_id and not dup.created
    expected = {("a", "pending"): 8, ("b", "pending"): 3}
    assert await stat_counts(broker) == await full_count(broker) == expected
    leases = await broker.claim(["a"], "w1", 8)
    assert len(leases) == 8
    by_id = {lease.job_id: lease for lease in leases}
    ids = [m.job_id for m in made[:8]]
    # completions (a batch), a retry, two dead-letterings, a release
    assert await broker.complete_if_leased([Completion(by_id[i], {"ok": i}) for i in ids[2:4]])
    assert await broker.fail_if_leased(Failure(by_id[ids[4]], "again")) == JobStatus.PENDING
    assert (
        await broker.fail_if_leased(
            Failure(by_id[ids[5]], "no", final=True, reason=DeadReason.FATAL)
        )
        == JobStatus.DEAD
    )
    assert (
        await broker.fail_if_leased(
            Failure(by_id[ids[6]], "no", final=True, reason=DeadReason.FATAL)
        )
        == JobStatus.DEAD
    )
    assert await broker.release_if_leased([by_id[ids[7]]]) == [ids[7]]
    assert await stat_counts(broker) == await full_count(broker)

    # two leases run out and are taken over (a stall each)
    async def both_stalled() -> bool:
        await broker.claim(["a"], "w2", 10)
        jobs = await broker.get_jobs(ids[:2])
        return all(j.stalls == 1 for j in jobs)

    await eventually(both_stalled, timeout=10)
    assert await stat_counts(broker) == await full_count(broker)
    # a requeue from the dead-letter queue, then purges of both kinds
    assert (await broker.requeue_dead([ids[5]])).requeued == [ids[5]]
    assert await stat_counts(broker) == await full_count(broker)

    async def purged_dead() -> bool:
        return await broker.purge_dead(0, "a") > 0

    await eventually(purged_dead)  # ids[6]: its finish must lie before "now"

    async def purged_finished() -> int:
        return await broker.purge_finished(0)

    await eventually(purged_finished)
    counts = await stat_counts(broker)
    assert counts == await full_count(broker)
    assert ("a", "dead") not in counts
    assert counts[("b", "pending")] == 3


async def test_purge_dead_takes_only_dead_jobs_older_than_the_cutoff_of_the_queue_given(broker):
    await broker.enqueue([job(queue="a"), job(queue="a"), job(queue="b"), job(queue="a")])
    for q, n in (("a", 2), ("b", 1)):
        for lease in await broker.claim([q], "w", n):
            await broker.fail_if_leased(Failure(lease, "x", final=True, reason=DeadReason.FATAL))
    assert await broker.purge_dead(3600) == 0  # none is an hour old
    assert len(await broker.list_jobs(status=JobStatus.DEAD)) == 3
    removed = 0

    async def both_of_a() -> bool:
        nonlocal removed
        removed += await broker.purge_dead(0, "a")
        return removed == 2

    await eventually(both_of_a)
    dead = await broker.list_jobs(status=JobStatus.DEAD)
    assert [j.queue for j in dead] == ["b"]
    stats = {s.queue: s.counts for s in await broker.stats()}
    assert stats["a"] == {JobStatus.PENDING: 1} and stats["b"] == {JobStatus.DEAD: 1}
    assert await broker.purge_dead(0, "a") == 0  # the pending job of "a" is not dead


async def test_purge_finished_removes_succeeded_jobs_but_not_the_throughput_they_made(broker):
    made = await broker.enqueue([job(), job(), job()])
    leases = await broker.claim(["default"], "w", 3)
    await broker.complete_if_leased([Completion(lease, None) for lease in leases[:2]])
    await broker.fail_if_leased(Failure(leases[2], "x", final=True, reason=DeadReason.FATAL))
    assert await broker.purge_finished(3600) == 0
    removed = 0

    async def both() -> bool:
        nonlocal removed
        removed += await broker.purge_finished(0)
        return removed == 2

    await eventually(both)
    assert [j.id for j in await broker.get_jobs([m.job_id for m in made])] == [made[2].job_id]
    assert {s.queue: s.counts for s in await broker.stats()} == {"default": {JobStatus.DEAD: 1}}
    tp = await broker.throughput(5)
    assert sum(tp.succeeded["default"]) == 2 and sum(tp.dead["default"]) == 1


async def test_ready_and_the_oldest_ready_age_come_from_pending_jobs_only(broker):
    await broker.enqueue([job(), job(delay=60)])
    await broker.enqueue([job()])
    (lease,) = await broker.claim(["default"], "w", 1)
    await broker.complete_if_leased([Completion(lease, None)])

    async def aged() -> bool:
        (s,) = await broker.stats()
        return s.oldest_ready_age is not None and s.oldest_ready_age > 0.05

    await eventually(aged)
    (s,) = await broker.stats()
    assert s.ready == 1 and s.counts[JobStatus.PENDING] == 2
    assert s.oldest_ready_age < 30
    (lease,) = await broker.claim(["default"], "w", 1)
    (s,) = await broker.stats()
    assert s.ready == 0 and s.oldest_ready_age is None
