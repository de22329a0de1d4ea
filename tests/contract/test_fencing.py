"""Contract: every write after a claim is fenced by the lease's token and expiry."""

from __future__ import annotations

import asyncio

from herd.queue.base import Completion, Failure, JobStatus
from tests.helpers import eventually, job


async def _taken_over(broker):
    (r,) = await broker.enqueue([job(lease_seconds=0.3)])
    (stale,) = await broker.claim(["default"], "old", 1)
    (fresh,) = await eventually(lambda: broker.claim(["default"], "new", 1), timeout=5)
    return r.job_id, stale, fresh


async def test_stale_holder_cannot_renew_complete_fail_or_release(broker):
    job_id, stale, fresh = await _taken_over(broker)
    assert await broker.renew_if_leased([stale]) == {}
    assert await broker.complete_if_leased([Completion(stale, "stale result")]) == [False]
    assert await broker.fail_if_leased(Failure(stale, "boom")) is None
    assert await broker.release_if_leased([stale]) == []
    stored = await broker.get_job(job_id)
    assert stored.status == JobStatus.PROCESSING
    assert stored.lease_owner == "new" and stored.result is None and stored.attempts == 0
    # The fresh holder's writes still work.
    assert job_id in await broker.renew_if_leased([fresh])
    assert await broker.complete_if_leased([Completion(fresh, "fresh result")]) == [True]
    assert (await broker.get_job(job_id)).result == "fresh result"


async def test_expired_lease_refuses_writes_even_before_anyone_takes_over(broker):
    (r,) = await broker.enqueue([job(lease_seconds=0.2)])
    (lease,) = await broker.claim(["default"], "w", 1)

    # Time passing is the subject here, so the test waits it out (twice the TTL).
    await asyncio.sleep(0.4)
    assert await broker.renew_if_leased([lease]) == {}
    assert await broker.complete_if_leased([Completion(lease, 1)]) == [False]
    assert (await broker.get_job(r.job_id)).status == JobStatus.PROCESSING


async def test_completion_batch_accepts_the_held_and_refuses_the_stale(broker):
    job_id, stale, _ = await _taken_over(broker)
    await broker.enqueue([job()])
    (held,) = await broker.claim(["default"], "w", 1)
    assert await broker.complete_if_leased([Completion(stale, "x"), Completion(held, "y")]) == [
        False,
        True,
    ]
    assert (await broker.get_job(held.job_id)).result == "y"
    assert (await broker.get_job(job_id)).result is None


async def test_completions_sent_with_a_claim_are_fenced_row_by_row(broker):
    job_id, stale, _ = await _taken_over(broker)  # "new" holds it now
    # Ahead of the taken-over job, whose short lease may expire again meanwhile.
    await broker.enqueue([job(priority=1), job(priority=1), job(priority=1)])
    held = await broker.claim(["default"], "w", 2)
    oks, leases = await broker.complete_and_claim(
        [Completion(stale, "stale"), *(Completion(h, i) for i, h in enumerate(held))],
        ["default"],
        "w",
        1,
    )
    assert oks == [False, True, True]
    assert len(leases) == 1 and leases[0].job_id not in {job_id, *(h.job_id for h in held)}
    stored = await broker.get_job(job_id)
    assert stored.status == JobStatus.PROCESSING
    assert stored.lease_owner == "new" and stored.result is None
    assert [(await broker.get_job(h.job_id)).result for h in held] == [0, 1]
    (stats,) = await broker.stats()
    assert stats.counts == {JobStatus.SUCCEEDED: 2, JobStatus.PROCESSING: 2}
    # A completion sent again (its first reply lost) is found stored; one with nothing
    # to claim is written all the same.
    oks, more = await broker.complete_and_claim(
        [Completion(held[0], 0), Completion(leases[0], "last")], ["empty"], "w", 5
    )
    assert oks == [True, True] and more == []
    assert (await broker.get_job(leases[0].job_id)).result == "last"


async def test_renewal_keeps_a_job_for_three_times_its_ttl(broker):
    # Renewed every third of it: a CI machine under load may stall a step for a few
    # hundred milliseconds, which a shorter lease would not survive.
    ttl = 1.0
    (r,) = await broker.enqueue([job(lease_seconds=ttl)])
    (lease,) = await broker.claim(["default"], "w", 1)
    loop = asyncio.get_running_loop()
    end = loop.time() + 3 * ttl
    while loop.time() < end:
        assert r.job_id in await broker.renew_if_leased([lease])
        assert await broker.claim(["default"], "thief", 1) == []
        await asyncio.sleep(ttl / 3)
    assert await broker.complete_if_leased([Completion(lease, "ok")]) == [True]
    stored = await broker.get_job(r.job_id)
    assert stored.status == JobStatus.SUCCEEDED and stored.stalls == 0


async def test_one_renewal_covers_every_lease_of_a_process(broker):
    await broker.enqueue([job() for _ in range(50)])
    leases = await broker.claim(["default"], "w", 50)
    renewed = await broker.renew_if_leased(leases)
    assert set(renewed) == {lease.job_id for lease in leases}
    assert all(expiry > lease.expires_at for lease in leases for expiry in [renewed[lease.job_id]])


async def test_completing_twice_with_the_same_token_is_idempotent(broker):
    await broker.enqueue([job()])
    (lease,) = await broker.claim(["default"], "w", 1)
    assert await broker.complete_if_leased([Completion(lease, 1)]) == [True]
    # A retry after a lost reply must not be reported as a lost lease.
    assert await broker.complete_if_leased([Completion(lease, 1)]) == [True]
