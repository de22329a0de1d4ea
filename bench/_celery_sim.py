"""What the Celery halves of the benches share: each worker process's clients of the
provider simulator (``BENCH_SIM_URL``, no ``/v1``) and of the Redis that is the broker
and holds the answers (``BENCH_CELERY_BROKER``), made on a task's first call."""

from __future__ import annotations

import os

import httpx
import redis

_clients: tuple[httpx.Client, redis.Redis] | None = None


def clients(max_connections: int | None = None) -> tuple[httpx.Client, redis.Redis]:
    """This process's (simulator, Redis) clients; ``max_connections``: the HTTP pool's
    size (httpx's default without it), for the thread pools that call many at once."""
    global _clients
    if _clients is None:
        pool = {}  # httpx's own default pool without a size
        if max_connections:
            pool["limits"] = httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            )
        http = httpx.Client(
            base_url=os.environ["BENCH_SIM_URL"] + "/v1",
            timeout=httpx.Timeout(120.0, connect=10.0),
            headers={"authorization": "Bearer sk-bench", "user-agent": "bench-celery"},
            **pool,
        )
        _clients = http, redis.Redis.from_url(os.environ["BENCH_CELERY_BROKER"])
    return _clients
