"""Contract: every write after a claim is fenced by the lease's token and expiry."""

from __future__ import annotations

import asyncio
import time

from herd.queue.base import Completion, Failure, JobStatus
from tests.helpers import LeaseRun, eventually, job, within_lease


async def _taken_over(broker, run: LeaseRun | None = None):
    """A job whose lease ran out and was taken over: its id, the stale and fresh leases.
    With ``run``, the fresh lease is the one the caller's next steps need to hold."""
    lease, q = (run.lease, [run.queue]) if run else (0.3, ["default"])
    (r,) = await broker.enqueue([job(queue=q[0], lease_seconds=lease)])
    (stale,) = await broker.claim(q, "old", 1)

    async def fresh_claim():
        if run is not None:
            run.start()
        return await broker.claim(q, "new", 1)

    (fresh,) = await eventually(fresh_claim, timeout=lease + 10)
    return r.job_id, stale, fresh


async def test_stale_holder_cannot_renew_complete_fail_or_release(broker):
    async def scenario(run: LeaseRun) -> None:
        job_id, stale, fresh = await _taken_over(broker, run)
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

    await within_lease(scenario)


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
    # In a queue of its own: the taken-over job's short lease may run out meanwhile.
    await broker.enqueue([job(queue="held")])
    (held,) = await broker.claim(["held"], "w", 1)
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
    # Renewed every third of it. A step that a loaded machine stalls past the ttl
    # proves nothing (within_lease tries again with a longer one).
    async def scenario(run: LeaseRun) -> None:
        ttl, q = run.lease, [run.queue]
        (r,) = await broker.enqueue([job(queue=run.queue, lease_seconds=ttl)])
        run.start()
        (lease,) = await broker.claim(q, "w", 1)
        end = time.monotonic() + 3 * ttl
        while time.monotonic() < end:
            sent = time.monotonic()
            assert r.job_id in await broker.renew_if_leased([lease])
            run.start(at=sent)
            assert await broker.claim(q, "thief", 1) == []
            await asyncio.sleep(ttl / 3)
        assert await broker.complete_if_leased([Completion(lease, "ok")]) == [True]
        stored = await broker.get_job(r.job_id)
        assert stored.status == JobStatus.SUCCEEDED and stored.stalls == 0

    await within_lease(scenario, lease=1.0, tries=3)


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
