"""Contenders for the cross-process mutual exclusion test in tests/test_locks.py.

    python -m tests.apps.lockrace BACKEND URL NAME CONTENDERS ROUNDS

Prints ``ready``, waits for a line on stdin (so every process contends at once),
then runs CONTENDERS asyncio tasks that each take the lock ROUNDS times. Every
critical section prints one JSON line ``[token, start_ns, end_ns, inside_in,
inside_out]``: the times are CLOCK_MONOTONIC, shared by the processes of one
machine, and ``inside_*`` are what a counter in the backend's own store read on
entry (1 unless someone else was inside) and on exit (0).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable

import psycopg
import redis.asyncio as aioredis

from herd.locks import BaseLocks, PostgresLocks, RedisLocks


async def main(backend: str, url: str, name: str, contenders: int, rounds: int) -> int:
    locks: BaseLocks
    step: Callable[[int], Awaitable[int]]
    if backend == "redis":
        locks = RedisLocks(url)
        client = aioredis.Redis.from_url(url)
        counter = f"lockrace:{name}:inside"

        async def step(delta: int) -> int:
            return int(await client.incrby(counter, delta))

    else:
        locks = PostgresLocks(url, auto_migrate=False, pool_size=contenders + 1)
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)

        async def step(delta: int) -> int:
            cur = await conn.execute(
                "UPDATE lock_race SET inside = inside + %s WHERE name = %s RETURNING inside",
                (delta, name),
            )
            row = await cur.fetchone()
            assert row is not None
            return int(row[0])

    failures = 0

    async def contender() -> None:
        nonlocal failures
        for _ in range(rounds):
            lease = await locks.acquire(name, ttl=10.0, wait=120.0)
            if lease is None:
                failures += 1
                continue
            start = time.monotonic_ns()
            inside_in = await step(1)
            await asyncio.sleep(random.uniform(0.0, 0.003))  # the work, widening any overlap
            inside_out = await step(-1)
            end = time.monotonic_ns()
            print(json.dumps([lease.token, start, end, inside_in, inside_out]), flush=True)
            if not await locks.release(lease):
                failures += 1

    async with locks:
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await asyncio.gather(*(contender() for _ in range(contenders)))
    return 1 if failures else 0


if __name__ == "__main__":
    backend, url, name, contenders, rounds = sys.argv[1:]
    sys.exit(asyncio.run(main(backend, url, name, int(contenders), int(rounds))))
