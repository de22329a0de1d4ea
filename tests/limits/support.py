"""The ``limiter`` fixture: every backend, and a second client that is another process's."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from herd.limits import Limiter, PostgresLimiter, RedisLimiter

BACKENDS = ["postgres", "redis", "redis-cluster"]
_URLS = {"redis": "redis_stack", "redis-cluster": "redis_cluster", "postgres": "pg_url"}


def url_for(request: pytest.FixtureRequest, kind: str) -> str:
    return str(request.getfixturevalue(_URLS[kind]))


def make(kind: str, url: str) -> Limiter:
    return PostgresLimiter(url) if kind == "postgres" else RedisLimiter(url)


@pytest.fixture(params=BACKENDS)
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[Limiter]:
    """An opened limiter of each backend; tests use scopes of their own (``scope``)."""
    lim = make(request.param, url_for(request, request.param))
    await lim.open()
    lim.url_for_tests = url_for(request, request.param)  # type: ignore[attr-defined]
    try:
        yield lim
    finally:
        await lim.close()


@pytest.fixture
def scope() -> str:
    return f"test:{uuid.uuid4().hex[:12]}:nokey"
