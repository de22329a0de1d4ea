"""Where a generation's dense vectors live: one protocol (``base``), one module per
store, and the table below that maps each URL scheme to its store.

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
``HERD_VECTOR_URL`` when it names the same place. A new store is one module and
one entry of ``BACKENDS``.

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

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from herd.errors import ConfigError
from herd.masking import mask
from herd.rag.vectors import milvus, pgvector, qdrant
from herd.rag.vectors.base import (
    DEFAULT,
    SETTING,
    Catalogue,
    Row,
    Space,
    StoreUrl,
    VectorStore,
    VectorStoreError,
)


@dataclass(frozen=True)
class Backend:
    """One kind of vector store: its URL scheme, how to open it, and the URLs it takes."""

    scheme: str
    open: Callable[[StoreUrl, Catalogue], VectorStore]
    forms: tuple[str, ...]  # the URLs it takes, as the error of a bad one lists them
    port: int | None = None  # a server's default port; None: no server form
    embedded: bool = True  # whether it also runs in this process at a path
    suffix: str = ""  # what an embedded path must end with
    extra: str = ""  # the pip extra its client comes with


BACKENDS = (
    Backend("pgvector", pgvector.open_store, ("pgvector",), embedded=False),
    Backend(
        "milvus",
        milvus.open_store,
        ("milvus:///path/file.db", "milvus://host:19530"),
        port=19530,
        suffix=".db",
        extra="milvus",
    ),
    Backend(
        "qdrant",
        qdrant.open_server_or_local,
        ("qdrant://host:6333", "qdrant:///path"),
        port=6333,
        extra="qdrant",
    ),
    Backend("qdrant+edge", qdrant.open_edge, ("qdrant+edge:///path",), extra="qdrant"),
)
_BY_SCHEME = {b.scheme: b for b in BACKENDS}
_ALL = [f for b in BACKENDS for f in b.forms]
FORMS = ", ".join(_ALL[:-1]) + f" or {_ALL[-1]}"


def parse(url: str | None) -> StoreUrl:
    """``HERD_VECTOR_URL`` checked; a ConfigError names the variable and the forms."""
    raw = (url or "").strip()
    if raw in ("", DEFAULT, "pgvector://"):
        return StoreUrl(DEFAULT, None, None, None)

    def bad(why: str) -> ConfigError:
        return ConfigError(f"{SETTING} {mask(raw)!r} {why}; use one of {FORMS}")

    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise bad(f"is not a URL ({exc})") from None
    backend = _BY_SCHEME.get(parts.scheme.lower())
    if backend is None or backend.scheme == DEFAULT:
        raise bad("names no vector store herd knows")
    if parts.query or parts.fragment:
        raise bad("has a query or fragment, which herd does not read")
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    if parts.hostname:
        if backend.port is None:
            raise bad(f"names a host, but {backend.scheme} is an embedded engine: give a folder")
        if parts.path not in ("", "/"):
            raise bad("has a path after the host")
        return StoreUrl(backend.scheme, parts.hostname, port or backend.port, None, user, password)
    if not parts.path.startswith("/") or parts.path == "/":
        raise bad("has neither a host nor an absolute path")
    if not parts.path.endswith(backend.suffix):
        raise bad(f"is a {backend.scheme} path that does not end in {backend.suffix}")
    return StoreUrl(backend.scheme, None, None, parts.path)


def open_store(url: StoreUrl, catalogue: Catalogue) -> VectorStore:
    """The store ``url`` names, opened; a missing client is a ConfigError naming its extra."""
    backend = _BY_SCHEME[url.scheme]
    try:
        return backend.open(url, catalogue)
    except ImportError as exc:
        raise ConfigError(
            f"{SETTING} asks for {url.scheme}, whose client is not installed ({exc.name}):"
            f" pip install 'herd[{backend.extra}]'"
        ) from None


def resolve(location: str, configured: StoreUrl) -> StoreUrl:
    """The URL to open a recorded location with: the configured one (credentials and
    all) when it names that place, else the location itself."""
    if configured.location == location:
        return configured
    return parse(location)


__all__ = [
    "BACKENDS",
    "DEFAULT",
    "SETTING",
    "Backend",
    "Row",
    "Space",
    "StoreUrl",
    "VectorStore",
    "VectorStoreError",
    "open_store",
    "parse",
    "resolve",
]
