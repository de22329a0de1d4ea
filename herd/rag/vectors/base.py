"""What a vector store is: the protocol every store implements, the generation as a
store sees it (``Space``), the rows it keeps, and a store's parsed URL (``StoreUrl``).
Which stores there are, and how a URL names each, is ``herd.rag.vectors``' table."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from psycopg import AsyncConnection
from psycopg.types import TypeInfo

from herd.errors import HerdError

SETTING = "HERD_VECTOR_URL"
DEFAULT = "pgvector"


class VectorStoreError(HerdError):
    """The vector store refused an operation or could not be reached."""


@dataclass(frozen=True)
class Space:
    """A generation as a vector store sees it."""

    id: int
    collection: str
    dim: int
    language: str = "english"

    @property
    def name(self) -> str:
        """The store's name for the generation's vectors (letters, digits, ``_``)."""
        return f"herd_g{self.id}"


@dataclass(frozen=True)
class Row:
    chunk_id: str
    hash: str
    vector: np.ndarray
    text: str


@dataclass(frozen=True)
class StoreUrl:
    scheme: str  # pgvector, milvus, qdrant, qdrant+edge
    host: str | None  # None: an embedded engine at ``path``
    port: int | None
    path: str | None
    user: str | None = None
    password: str | None = None

    @property
    def location(self) -> str:
        """The URL without credentials: what a generation records."""
        if self.scheme == DEFAULT:
            return DEFAULT
        if self.host is None:
            return f"{self.scheme}://{self.path}"
        return f"{self.scheme}://{self.host}:{self.port}"


class Catalogue(Protocol):
    """What a store may ask of herd's catalogue (``RagStore``): its connections (pgvector
    keeps its vectors in the catalogue's tables) and pgvector's type."""

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]: ...

    async def fetch(self, query: Any, params: Any = None) -> list[tuple[Any, ...]]: ...

    async def vector_type(self) -> TypeInfo: ...


class VectorStore(Protocol):
    """The dense vectors of generations, one space per generation."""

    url: StoreUrl
    # True: ``upsert`` writes the catalogue row itself, in the caller's transaction
    # (so nothing else needs fencing); False: the caller writes that row after it.
    joins_transaction: bool

    async def create(self, conn: Any, space: Space) -> None:
        """Make the space (idempotent); ``conn`` is the catalogue's open transaction."""

    async def upsert(self, conn: Any, space: Space, rows: Sequence[Row], token: int) -> int:
        """Write the rows unless the store holds them at a newer ``token``; how many
        were written (the others are a newer writer's)."""

    async def prepare(self, space: Space) -> None:
        """Once the space is loaded, before it goes live: index it, make it durable."""

    async def inventory(self, space: Space) -> dict[str, str]:
        """chunk id -> hash of every vector in the space (the swap's check)."""

    async def search(
        self, space: Space, vector: np.ndarray, k: int, ef: int
    ) -> list[tuple[str, float]]:
        """The k nearest chunk ids by cosine, best first; GenerationGone once dropped."""

    async def delete(self, space: Space, chunk_ids: Sequence[str]) -> None: ...

    async def publish(self, space: Space) -> None:
        """Point the collection's alias at this space, atomically (after the swap)."""

    async def drop(self, space: Space) -> None:
        """Remove the space and its vectors (idempotent)."""

    async def close(self) -> None: ...


__all__ = [
    "DEFAULT",
    "SETTING",
    "Catalogue",
    "Row",
    "Space",
    "StoreUrl",
    "VectorStore",
    "VectorStoreError",
]
