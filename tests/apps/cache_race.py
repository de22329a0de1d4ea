"""A process of N concurrent callers of one cache key (the singleflight test's contender).

usage: python -m tests.apps.cache_race BACKEND URL KEY CALLERS COMPUTE_SECONDS
Each computation increments a counter in the backend itself, so the test can
count model calls across processes. Prints one JSON line of the callers' results.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import psycopg
import redis.asyncio as aioredis

from herd.cache import ExactCache
from herd.cache.stores import CACHES
from herd.locks.registry import locks_for


async def main(backend: str, url: str, key: str, callers: int, seconds: float) -> None:
    store, locks = CACHES[backend].store(url), locks_for(backend, url, poll_interval=0.1)

    async def count_call() -> None:
        if backend == "postgres":
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute("INSERT INTO race_calls (key, pid) VALUES (%s, %s)",
                                   (key, os.getpid()))  # fmt: skip
        else:
            client = aioredis.Redis.from_url(url)
            await client.rpush(f"race_calls:{key}", os.getpid())
            await client.aclose()

    async def compute() -> dict[str, object]:
        await count_call()
        print("computing", flush=True, file=sys.stderr)
        await asyncio.sleep(seconds)
        return {"answer": 42, "pid": os.getpid()}

    await store.open()
    await locks.open()
    cache = ExactCache(store, locks, namespace="race", lock_ttl=1.0, wait=60)
    try:
        results = await asyncio.gather(
            *(cache.get_or_compute(key, compute) for _ in range(callers))
        )
        print(json.dumps([[r.source, r.value] for r in results]), flush=True)
    finally:
        await locks.close()
        await store.close()


if __name__ == "__main__":
    b, u, k, n, s = sys.argv[1:6]
    asyncio.run(main(b, u, k, int(n), float(s)))
