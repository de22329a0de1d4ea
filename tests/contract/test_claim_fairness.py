"""Contract: a worker serving several queues is not starved of one by a busy other."""

from __future__ import annotations

from herd.queue.base import Broker
from tests.helpers import job


async def test_a_busy_first_queue_does_not_starve_the_next(broker: Broker) -> None:
    await broker.enqueue([job(queue="a", payload={"i": i}) for i in range(20)])
    await broker.enqueue([job(queue="b", payload={"i": i}) for i in range(2)])
    # One job per claim, as a worker with one free slot claims: within a few claims
    # queue b's jobs come, long before queue a is empty.
    queues = [(await broker.claim(["a", "b"], "w", 1))[0].queue for _ in range(6)]
    assert queues.count("b") == 2, queues
