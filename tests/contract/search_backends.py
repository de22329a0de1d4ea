"""The backends of the two search seams, each listed once; each seam's suite runs on
every entry through one fixture (``store`` there, ``backend_url``).

    vector store    tests/contract/test_vector_store.py  VECTOR_STORES    herd.rag.vectors
    semantic store  tests/semantic/ (conftest.py)        SEMANTIC_STORES  herd.semantic.stores

An entry says how to reach an empty store of that kind on the session's servers
(tests/conftest.py starts PostgreSQL and Redis Stack; a Milvus server starts here, on
first use), and, for the vector stores, how a test reads behind herd's back. A new
backend passes a seam's suite by adding one entry to its table.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import flush_redis

Request = pytest.FixtureRequest

# -- vector stores (herd.rag.vectors.BACKENDS)


def _milvus_alias(client: Any, alias: str) -> str:
    return str(client.describe_alias(alias)["collection_name"])


def _qdrant_alias(client: Any, alias: str) -> str:
    return {a.alias_name: a.collection_name for a in client.get_aliases().aliases}[alias]


@dataclass(frozen=True)
class VectorBackend:
    url: Callable[[Request, Path], str]
    """The HERD_VECTOR_URL of an empty store, given the test's folder."""
    aliased: Callable[[Any, str], str] | None = None
    """The collection the store's alias names, asked of its client (None: no aliases)."""
    known_warning: str = ""
    """A warning its client logs on a scan that is right for this backend, if any."""


VECTOR_STORES: dict[str, VectorBackend] = {
    "pgvector": VectorBackend(lambda r, d: "pgvector"),
    "milvus-lite": VectorBackend(lambda r, d: f"milvus://{d}/vectors.db", _milvus_alias),
    # pymilvus 3 asks a 2.3 server for a session timestamp it does not serve, and says
    # that it uses the client's clock instead: true of that server, so it is shown.
    "milvus-server": VectorBackend(
        lambda r, d: str(r.getfixturevalue("milvus_server")),
        _milvus_alias,
        known_warning="failed to get mvccTs",
    ),
    "qdrant-local": VectorBackend(lambda r, d: f"qdrant://{d}/qdrant", _qdrant_alias),
    "qdrant-edge": VectorBackend(lambda r, d: f"qdrant+edge://{d}/edge"),
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def milvus_server(folder: Path) -> Iterator[str]:
    """A Milvus standalone server (the ``milvus`` package: 2.3's binary with an embedded
    etcd and local storage) in ``folder``, up while the generator is; its ``milvus://`` URL."""
    milvus = pytest.importorskip("milvus", reason="the milvus package (a Milvus server)")
    port = _free_port()
    server = milvus.MilvusServer(data_dir=str(folder), proxy_port=port)
    server.start()  # returns once its /healthz answers
    try:
        yield f"milvus://127.0.0.1:{port}"
    finally:
        server.stop()


# -- semantic stores (herd.semantic.stores.STORES)


def _postgres(request: Request) -> str:
    url = str(request.getfixturevalue("pg_url"))
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('herd_semantic')").fetchone()[0]:  # type: ignore[index]
            conn.execute("TRUNCATE herd_semantic, herd_semantic_stats, herd_semantic_sizes")
    return url


def _redis_stack(request: Request) -> str:
    url = str(request.getfixturevalue("redis_stack"))
    flush_redis(url)
    return url


SEMANTIC_STORES: dict[str, Callable[[Request], str]] = {
    "postgres": _postgres,  # pgvector
    "redis": _redis_stack,  # Redis Stack's search module
}
