"""Contract: claims are exclusive, ordered, delayed, batched, and recover expired leases."""

from __future__ import annotations

import asyncio
from collections import Counter

from herd.queue.base import JobStatus
from tests.helpers import LeaseRun, eventually, job, within_lease


async def test_twenty_concurrent_claimers_never_share_a_job(broker):
    await broker.enqueue([job(payload={"i": i}) for i in range(300)])
    claimed: Counter[int] = Counter()

    async def claimer(n: int) -> None:
        while True:
            leases = await broker.claim(["default"], f"w{n}", 1 + n % 3)
            if not leases:
                return
            claimed.update(lease.job_id for lease in leases)

    await asyncio.gather(*(claimer(n) for n in range(20)))
    assert len(claimed) == 300
    assert max(claimed.values()) == 1


async def test_several_jobs_per_claim_by_priority_then_age(broker):
    priorities = [0, 5, 1, 5, 0, 9]
    ids = [r.job_id for r in await broker.enqueue([job(priority=p) for p in priorities])]
    leases = await broker.claim(["default"], "w", 4)
    assert {lease.job_id for lease in leases} == {ids[5], ids[1], ids[3], ids[2]}
    assert len({lease.token for lease in leases}) >= 1
    (rest,) = await broker.claim(["default"], "w", 1)
    assert rest.job_id == ids[0]


async def test_claim_order_is_priority_then_age(broker):
    ids = [r.job_id for r in await broker.enqueue([job(priority=p) for p in [0, 5, 1, 5, 0, 9]])]
    order = []
    while leases := await broker.claim(["default"], "w", 1):
        order.append(leases[0].job_id)
    assert order == [ids[5], ids[1], ids[3], ids[2], ids[0], ids[4]]


async def test_queues_are_separate(broker):
    await broker.enqueue([job(queue="a"), job(queue="b")])
    (lease,) = await broker.claim(["b"], "w", 10)
    assert lease.queue == "b"
    assert len(await broker.claim(["a", "b"], "w", 10)) == 1


async def test_delayed_job_is_claimed_only_when_due(broker):
    (r,) = await broker.enqueue([job(delay=0.6)])
    assert await broker.claim(["default"], "w", 1) == []
    (lease,) = await eventually(lambda: broker.claim(["default"], "w", 1), timeout=5)
    assert lease.job_id == r.job_id
    stored = await broker.get_job(r.job_id)
    assert (stored.lease_expires_at - stored.run_at).total_seconds() >= 0


async def test_expired_lease_is_taken_over_with_a_new_token_and_a_stall(broker):
    async def scenario(run: LeaseRun) -> None:
        q = [run.queue]
        (r,) = await broker.enqueue([job(queue=run.queue, lease_seconds=run.lease)])
        run.start()
        (first,) = await broker.claim(q, "w1", 1)
        assert await broker.claim(q, "w2", 1) == []  # held
        (second,) = await eventually(lambda: broker.claim(q, "w2", 1), timeout=run.lease + 10)
        assert second.job_id == r.job_id
        assert second.token > first.token
        assert second.stalls == 1 and second.attempts == 0
        stored = await broker.get_job(r.job_id)
        assert stored.status == JobStatus.PROCESSING
        assert stored.lease_owner == "w2"
        assert "w1" in stored.last_error

    await within_lease(scenario, lease=0.4)
