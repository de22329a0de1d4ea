"""next_due on every backend: what an idle worker that stops when idle reads."""

from __future__ import annotations

from herd.queue.base import NewJob


async def test_next_due_says_when_the_first_pending_job_is_due(broker):
    assert await broker.next_due(["nd"]) is None
    await broker.enqueue([NewJob(task="t", payload={}, queue="nd", delay=3600.0)])
    due = await broker.next_due(["nd"])
    assert due is not None and 3500 < due <= 3600
    assert await broker.next_due(["other"]) is None
    await broker.enqueue([NewJob(task="t", payload={}, queue="nd2")])
    assert await broker.next_due(["nd", "nd2"]) == 0.0
    (lease,) = await broker.claim(["nd2"], "w", 1)
    due = await broker.next_due(["nd", "nd2"])
    assert due is not None and due > 3500  # a leased job is not pending
