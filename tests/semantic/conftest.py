"""One fixture, both backends: every semantic cache test runs on pgvector and on Redis Stack."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from herd.semantic import SemanticCache
from tests.conftest import flush_redis

DIM = 8  # synthetic vectors: small, exact, and an index of their own


@pytest.fixture(params=["postgres", "redis"])
def backend_url(request: pytest.FixtureRequest) -> tuple[str, str]:
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")
        with psycopg.connect(url, autocommit=True) as conn:
            if conn.execute("SELECT to_regclass('herd_semantic')").fetchone()[0]:  # type: ignore[index]
                conn.execute("TRUNCATE herd_semantic, herd_semantic_stats, herd_semantic_sizes")
    else:
        url = request.getfixturevalue("redis_stack")
        flush_redis(url)
    return request.param, url


MakeCache = Callable[..., Awaitable[SemanticCache]]


@pytest.fixture
async def make_cache(backend_url: tuple[str, str]) -> AsyncIterator[MakeCache]:
    made: list[SemanticCache] = []

    async def make(**kw: Any) -> SemanticCache:
        if "embedder" not in kw:
            kw.setdefault("embedder_id", "synthetic-v1")
            kw.setdefault("dim", DIM)
        cache = SemanticCache(backend_url[1], **kw)
        await cache.open()
        made.append(cache)
        return cache

    yield make
    for cache in made:
        await cache.close()


@pytest.fixture(scope="session")
def embedder(herd_home: Path) -> Any:
    from herd.rag.embedders import minilm_embedder

    return minilm_embedder(herd_home)


def unit(i: int, dim: int = DIM) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    v[i] = 1.0
    return v


def at_angle(similarity: float, dim: int = DIM) -> np.ndarray:
    """A float32 vector whose cosine to unit(0) is ``similarity`` up to float32 rounding."""
    v = np.zeros(dim, dtype=np.float64)
    v[0], v[1] = similarity, np.sqrt(max(0.0, 1 - similarity**2))
    return v.astype(np.float32)


def random_vectors(n: int, dim: int = DIM, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)
