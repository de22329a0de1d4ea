"""Where a generation's dense vectors live: one protocol, one module per store.

PostgreSQL keeps the catalogue whatever the store (collections, generations, the
chunks and their texts, and each generation's table ``herd_vectors_<id>`` of
chunk ids, hashes and lexemes, which lexical search and the "what is missing"
checks read); a ``VectorStore`` keeps only the vectors. ``HERD_VECTOR_URL``
chooses the store of new generations:

- unset or ``pgvector``: a column of that same table (the default);
- ``milvus:///path/file.db``: Milvus Lite in this process; ``milvus://host:19530``:
  a Milvus server (``milvus://user:password@host:19530`` with authentication);
- ``qdrant://host:6333``: a Qdrant server (``qdrant://:API_KEY@host:6333``);
  ``qdrant:///path``: qdrant-client's local mode in a folder (one process at a time);
- ``qdrant+edge:///path``: the embedded Rust engine of qdrant-edge, a shard per
  generation in that folder (one process at a time).

A generation records its store's location (the URL without credentials), so a
query reads the store the generation was built in; credentials come from
``HERD_VECTOR_URL`` when it names the same place.

Fencing. pgvector joins the job's fenced transaction. The others cannot, so each
vector carries the partition lock's fencing token (it grows strictly per lock
name across holders; a job's lease token is per job, so two jobs that embed the
same chunk could not be ordered by theirs) and a write with a token older than
the stored one is refused: Qdrant (server, local mode and edge) by a conditional
upsert, atomic per point; Milvus, which has no conditional write, by reading the
stored tokens of the batch and writing only the rows whose token is not newer
(see ``herd.rag.vectors.milvus`` for the window this leaves).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import numpy as np

from herd.errors import ConfigError, HerdError

SETTING = "HERD_VECTOR_URL"
DEFAULT = "pgvector"
FORMS = (
    "pgvector, milvus:///path/file.db, milvus://host:19530, qdrant://host:6333,"
    " qdrant:///path or qdrant+edge:///path"
)


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


_PORTS = {"milvus": 19530, "qdrant": 6333}
_MODULES = {
    "pgvector": "herd.rag.vectors.pgvector",
    "milvus": "herd.rag.vectors.milvus",
    "qdrant": "herd.rag.vectors.qdrant",
    "qdrant+edge": "herd.rag.vectors.qdrant",
}


def parse(url: str | None) -> StoreUrl:
    """``HERD_VECTOR_URL`` checked; a ConfigError names the variable and the forms."""
    raw = (url or "").strip()
    if raw in ("", DEFAULT, "pgvector://"):
        return StoreUrl(DEFAULT, None, None, None)

    def bad(why: str) -> ConfigError:
        from herd.masking import mask

        return ConfigError(f"{SETTING} {mask(raw)!r} {why}; use one of {FORMS}")

    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise bad(f"is not a URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in _MODULES or scheme == DEFAULT:
        raise bad("names no vector store herd knows")
    if parts.query or parts.fragment:
        raise bad("has a query or fragment, which herd does not read")
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    if parts.hostname:
        if scheme == "qdrant+edge":
            raise bad("names a host, but qdrant+edge is an embedded engine: give a folder")
        if parts.path not in ("", "/"):
            raise bad("has a path after the host")
        return StoreUrl(scheme, parts.hostname, port or _PORTS[scheme], None, user, password)
    if not parts.path.startswith("/") or parts.path == "/":
        raise bad("has neither a host nor an absolute path")
    if scheme == "milvus" and not parts.path.endswith(".db"):
        raise bad("is a Milvus Lite path that does not end in .db")
    return StoreUrl(scheme, None, None, parts.path)


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


def open_store(url: StoreUrl, catalogue: Any) -> VectorStore:
    """The store ``url`` names; its client is imported only now (an extra)."""
    try:
        module = importlib.import_module(_MODULES[url.scheme])
    except ImportError as exc:
        extra = url.scheme.split("+")[0]
        raise ConfigError(
            f"{SETTING} asks for {url.scheme}, whose client is not installed ({exc.name}):"
            f" pip install 'herd[{extra}]'"
        ) from None
    store: VectorStore = module.open_store(url, catalogue)
    return store


def resolve(location: str, configured: StoreUrl) -> StoreUrl:
    """The URL to open a recorded location with: the configured one (credentials and
    all) when it names that place, else the location itself."""
    if configured.location == location:
        return configured
    return parse(location)


__all__ = [
    "DEFAULT",
    "SETTING",
    "Row",
    "Space",
    "StoreUrl",
    "VectorStore",
    "VectorStoreError",
    "open_store",
    "parse",
    "resolve",
]
