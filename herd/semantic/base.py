"""What a semantic cache backend stores and the verbs it implements.

The policy (threshold, guards, TTL, singleflight, statistics) lives in
``SemanticCache``; a backend supplies a KNN search filtered by scope and expiry
inside the index query, an upsert that keeps the entry bound, and bookkeeping.
Both backends keep times as epoch seconds of the server's clock, read by the
cache, so expiry means the same thing on each.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from herd.jsonvalue import JSON
from herd.locks.base import BaseLocks

Vector = npt.NDArray[np.float32]
NEVER = 1e18  # the expiry of an entry without a ttl: a number, so that range filters work


@dataclass(frozen=True)
class Scope:
    """What an entry belongs to; a lookup only ever sees entries of its own scope."""

    tenant: str = "default"
    embedder: str = ""
    collection: str = ""
    generation: str = ""

    def tags(self) -> dict[str, str]:
        """Hashed scope values: safe as Redis tags and cheap to compare in SQL."""
        return {
            "tenant": _tag(self.tenant),
            "embedder": _tag(self.embedder),
            "collection": _tag(self.collection),
            "generation": _tag(self.generation),
        }


@functools.lru_cache(maxsize=4096)
def _tag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class NewEntry:
    id: str  # a hash of the cache name, the scope and the normalized query: one entry each
    scope: Scope
    query: str
    guard: dict[str, Any]
    value: JSON
    vector: Vector
    delta: float  # seconds the computation took (XFetch)
    created_at: float
    expires_at: float  # NEVER without a ttl
    keep_stale: float  # seconds the entry outlives its expiry for stale-while-revalidate


@dataclass(frozen=True)
class Candidate:
    """A nearest neighbour in scope, unexpired (or inside the stale window)."""

    id: str
    query: str
    guard: dict[str, Any]
    value: JSON
    vector: Vector  # as stored, float32: the cache re-scores it in float64
    delta: float
    created_at: float
    expires_at: float
    # The bounded mode's verdicts on this entry's hits, oldest first: (similarity, right).
    verdicts: list[tuple[float, bool]] = field(default_factory=list)


class SemanticStore(Protocol):
    name: str  # "redis" or "postgres"

    async def open(self, dim: int | None) -> None:
        """Connect and create the table or index for vectors of ``dim`` dimensions
        (None: only for bookkeeping, such as stats and clear)."""
        ...

    async def close(self) -> None: ...

    def locks(self) -> BaseLocks:
        """Fenced locks on the same server, for the cache's singleflight."""
        ...

    async def server_time(self) -> float:
        """The server's clock, epoch seconds."""
        ...

    def quantize(self, vector: Vector) -> Vector:
        """``vector`` as this store keeps it (float32 holding its precision): the cache
        searches, stores and scores that, so a threshold holds exactly on what is kept
        and a query meets its own entry at similarity 1."""
        ...

    async def search(
        self, cache: str, scope: Scope, vector: Vector, *, k: int, alive_at: float, floor: float
    ) -> tuple[float | None, list[Candidate]]:
        """The similarity of the nearest entry of ``scope`` expiring after ``alive_at``
        (by the index, in float32; None if there is none) and, nearest first, those of
        the ``k`` nearest whose index similarity reaches ``floor``.

        Scope and expiry filter inside the KNN query, never after it, so that other
        tenants' entries cannot crowd out the candidates of this one. ``floor`` lets a
        backend skip decoding candidates that cannot pass.
        """
        ...

    async def put(self, cache: str, entry: NewEntry, *, max_entries: int, now: float) -> int:
        """Upsert, then evict the least recently used past ``max_entries``; returns evictions."""
        ...

    async def touch(
        self,
        cache: str,
        used: dict[str, float],
        expires: dict[str, tuple[float, float]] | None = None,
        *,
        now: float = 0.0,
    ) -> None:
        """Record last use (for eviction) and, for a sliding ttl, move expiries:
        ``expires`` maps an id to its new expiry and its stale window; ``now`` is
        the time of the move."""
        ...

    async def judge(
        self, cache: str, entry_id: str, similarity: float, correct: bool, *, keep: int
    ) -> None:
        """Append a verdict to an entry's (keeping the newest ``keep``); a gone entry is
        left gone."""
        ...

    async def clear(self, cache: str | None = None, collection: str | None = None) -> int: ...

    async def add_stats(self, cache: str, amounts: dict[str, int]) -> None: ...

    async def read_stats(self) -> dict[str, dict[str, int]]:
        """Persisted counters per cache name, with ``entries`` (what is stored now)."""
        ...


def similarities(query: Vector, stored: list[Vector]) -> list[float]:
    """Cosine similarities in float64 of float32 vectors, so that a threshold holds
    exactly: the index's float32 distance only chooses the candidates."""
    if not stored:
        return []
    a = np.asarray(query, dtype=np.float64)
    b = np.asarray(stored, dtype=np.float64)
    na, nb = float(np.linalg.norm(a)), np.linalg.norm(b, axis=1)
    out = []
    # Row by row, not one matrix product: the same summation order whatever the
    # number of candidates, so a score never moves by an ulp across a boundary.
    for row, norm in zip(b, nb, strict=True):
        dot = float(row @ a)
        if na == 0.0 or norm == 0.0:
            out.append(0.0)
        elif np.array_equal(row, a):  # rounding must not keep a vector from matching itself
            out.append(1.0)
        else:
            out.append(max(-1.0, min(1.0, dot / (na * float(norm)))))
    return out


def similarity(query: Vector, stored: Vector) -> float:
    return similarities(query, [stored])[0]


def as_vector(values: Any, dim: int | None = None) -> Vector:
    vec: Vector = np.ascontiguousarray(np.asarray(values, dtype=np.float32).reshape(-1))
    if dim is not None and vec.shape[0] != dim:
        raise ValueError(f"expected a vector of {dim} dimensions, not {vec.shape[0]}")
    if not np.all(np.isfinite(vec)):
        raise ValueError("the vector has NaN or infinite components")
    return vec
