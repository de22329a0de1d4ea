"""One fixture, every backend: each semantic cache test runs on every semantic store
(listed once, in tests/contract/backends.py: pgvector and Redis Stack)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from herd.semantic import SemanticCache
from tests.contract.backends import SEMANTIC_STORES

DIM = 8  # synthetic vectors: small, exact, and an index of their own


@pytest.fixture(params=list(SEMANTIC_STORES))
def backend_url(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(name, URL) of each semantic store (tests/contract/backends.py), emptied."""
    return request.param, SEMANTIC_STORES[request.param](request)


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
