"""Claimers for the concurrency-key bound in tests/contract/test_concurrency_keys.py.

    python -m tests.apps.keyrace BROKER URL QUEUE CLAIMERS

Opens the job store (``BROKER``: postgres or redis, ``URL`` as the test's broker has
it), prints ``ready``, waits for a line on stdin (so every process claims at once),
then runs CLAIMERS asyncio tasks that claim, hold each job a few milliseconds and
complete it, until the queue has no keyed work left. Prints one JSON line per job
held: ``[key, job_id, start_ns, end_ns]``, CLOCK_MONOTONIC (shared by the processes
of one machine), taken after the claim returned and before the completion was sent:
each interval lies inside the time the store counted the job as running.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from herd.queue.base import Broker, Completion
from herd.queue.postgres import PostgresBroker
from herd.queue.redis import RedisBroker


async def main(kind: str, url: str, queue: str, claimers: int) -> int:
    broker: Broker = (
        # Fewer connections than claimers: the suite's PostgreSQL (100 connections) is
        # shared by every test worker and its PgBouncer; 3 processes x 16 held 48 of
        # them and starved PgBouncer's logins elsewhere (connection timeouts).
        PostgresBroker(url, auto_migrate=False, pool_size=min(claimers, 6))
        if kind == "postgres"
        else RedisBroker(url, pool_size=claimers)
    )
    await broker.open()
    held: list[list[object]] = []
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)

    async def claimer(n: int) -> None:
        owner = f"keyrace-{n}"
        while True:
            leases = await broker.claim([queue], owner, 1 + n % 3)
            if not leases:
                if not any(k.queue == queue for k in await broker.key_stats(1000)):
                    return
                await asyncio.sleep(0.002)  # a poll, as a worker's
                continue
            for lease in leases:
                start = time.monotonic_ns()
                await asyncio.sleep(0.003)  # the job's work
                end = time.monotonic_ns()
                assert isinstance(lease.payload, dict)
                held.append([lease.payload["key"], lease.job_id, start, end])
            assert all(await broker.complete_if_leased([Completion(x, None) for x in leases]))

    try:
        await asyncio.gather(*(claimer(n) for n in range(claimers)))
    finally:
        await broker.close()
    for row in held:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    kind, url, queue, n = sys.argv[1:5]
    sys.exit(asyncio.run(main(kind, url, queue, int(n))))
