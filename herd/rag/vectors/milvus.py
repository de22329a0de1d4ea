"""Milvus through pymilvus: Milvus Lite in a file (``milvus:///path/file.db``) or a
server (``milvus://host:19530``).

A generation is a collection ``herd_g<id>`` keyed by chunk id (VARCHAR), with the
chunk's hash, the fencing token of its last write and the vector under an HNSW
index (cosine). Swap: the alias ``herd_<name>`` (for other readers) moves to the
new collection in one ``alter_alias``, after herd's catalogue has swapped.

Fencing: Milvus has no conditional write, so an upsert reads the batch's stored
tokens and writes only the rows whose stored token is not newer than its own
(read-compare-write). That is exact against every writer herd runs: the upsert
happens inside the job's transaction after ``PostgresLocks.assert_held``, whose
share lock on the partition's lock row keeps any newer holder from taking the
lock (and getting its token) until the write is done, and within one process
the store's own lock serialises the read and the write. What it does not cover
is a writer that skips herd's locks (another program writing the collection).
Collections are created with Strong consistency, so the read sees every write
acknowledged before it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from herd.rag.vectors.base import Row, Space, StoreUrl, VectorStoreError
from herd.rag.vectors.engine import SCROLL, T, Threaded, alias, gone

MAX_ID = 65_535  # Milvus's longest VARCHAR; chunk ids are far shorter
_NO_SESSION_TS = "failed to get mvccTs"


def _lite_has_no_session_ts(record: logging.LogRecord) -> bool:
    """Milvus Lite serves no session timestamp, so every query_iterator (the inventory's
    scan) warned that it falls back to the client's clock: right for one process's
    file, and a warning a user of ``herd ingest`` could do nothing about."""
    return _NO_SESSION_TS not in record.getMessage()


class MilvusVectors(Threaded):
    joins_transaction = False

    def __init__(self, url: StoreUrl) -> None:
        super().__init__()
        from pymilvus import DataType, MilvusClient, MilvusException

        self.url, self.types, self.error = url, DataType, MilvusException
        self._loaded: set[str] = set()
        if url.host is None:
            assert url.path is not None
            logger = logging.getLogger("pymilvus.client.iterator.query_iterator")
            if _lite_has_no_session_ts not in logger.filters:
                logger.addFilter(_lite_has_no_session_ts)
            self.client = MilvusClient(uri=url.path)
        else:
            token = f"{url.user or ''}:{url.password}" if url.password else ""
            self.client = MilvusClient(uri=f"http://{url.host}:{url.port}", token=token)

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return await super()._call(fn, *args, **kwargs)
        except self.error as exc:
            raise VectorStoreError(f"Milvus at {self.url.location}: {exc.message}") from None

    def _ready(self, space: Space) -> None:
        """Load the collection once per process: a collection another process (or an
        earlier run of Milvus Lite) wrote is released, and refuses reads until loaded."""
        if space.name not in self._loaded:
            if not self.client.has_collection(space.name):
                raise gone(space)
            self.client.load_collection(space.name)
            self._loaded.add(space.name)

    async def create(self, conn: Any, space: Space) -> None:
        t = self.types

        def create() -> None:
            if self.client.has_collection(space.name):
                return
            schema = self.client.create_schema(auto_id=False)
            schema.add_field("chunk_id", t.VARCHAR, is_primary=True, max_length=MAX_ID)
            schema.add_field("hash", t.VARCHAR, max_length=256)
            schema.add_field("token", t.INT64)
            schema.add_field("embedding", t.FLOAT_VECTOR, dim=space.dim)
            index = self.client.prepare_index_params()
            index.add_index(
                "embedding",
                index_type="HNSW",
                metric_type="COSINE",
                params={"M": 16, "efConstruction": 64},  # pgvector's defaults
            )
            self.client.create_collection(space.name, schema=schema, consistency_level="Strong")
            # Not waited for: the wait asks the server for a timestamp, which Milvus Lite
            # does not serve (it logs a traceback); a server builds it on sealed segments.
            self.client.create_index(space.name, index, sync=False)
            self.client.load_collection(space.name)

        await self._call(create)

    async def upsert(self, conn: Any, space: Space, rows: Sequence[Row], token: int) -> int:
        if not rows:
            return 0

        def upsert() -> int:
            self._ready(space)
            stored = self.client.get(
                space.name, ids=[r.chunk_id for r in rows], output_fields=["chunk_id", "token"]
            )
            newer = {str(e["chunk_id"]) for e in stored if int(e["token"]) > token}
            data = [
                {
                    "chunk_id": r.chunk_id,
                    "hash": r.hash,
                    "token": token,
                    "embedding": np.asarray(r.vector, dtype=np.float32).tolist(),
                }
                for r in rows
                if r.chunk_id not in newer
            ]
            if data:
                self.client.upsert(space.name, data)
            return len(data)

        return await self._call(upsert)

    async def prepare(self, space: Space) -> None:
        def flush() -> None:
            self.client.flush(space.name)  # sealed segments get their HNSW index
            self.client.load_collection(space.name)

        await self._call(flush)

    async def inventory(self, space: Space) -> dict[str, str]:
        def scan() -> dict[str, str]:
            self._ready(space)
            out: dict[str, str] = {}
            it = self.client.query_iterator(
                space.name, batch_size=SCROLL, output_fields=["chunk_id", "hash"]
            )
            try:
                while batch := it.next():
                    out.update((str(e["chunk_id"]), str(e["hash"])) for e in batch)
            finally:
                it.close()
            return out

        return await self._call(scan)

    async def search(
        self, space: Space, vector: np.ndarray, k: int, ef: int
    ) -> list[tuple[str, float]]:
        def search() -> list[tuple[str, float]]:
            self._ready(space)
            try:
                found = self.client.search(
                    space.name,
                    data=[np.asarray(vector, dtype=np.float32).tolist()],
                    limit=k,
                    anns_field="embedding",
                    search_params={"metric_type": "COSINE", "params": {"ef": max(ef, k)}},
                    output_fields=["chunk_id"],
                )
            except self.error:
                if not self.client.has_collection(space.name):
                    raise gone(space) from None
                raise
            return [(str(h["chunk_id"]), float(h["distance"])) for h in found[0]]

        return await self._call(search)

    async def delete(self, space: Space, chunk_ids: Sequence[str]) -> None:
        if chunk_ids:

            def delete() -> None:
                self._ready(space)
                self.client.delete(space.name, ids=list(chunk_ids))

            await self._call(delete)

    async def publish(self, space: Space) -> None:
        name = alias(space.collection)

        def move() -> None:
            if name in self.client.list_aliases().get("aliases", []):
                self.client.alter_alias(space.name, name)  # atomic: old or new, never none
            else:
                self.client.create_alias(space.name, name)  # the collection's first

        await self._call(move)

    async def drop(self, space: Space) -> None:
        self._loaded.discard(space.name)
        await self._call(self.client.drop_collection, space.name)

    async def close(self) -> None:
        await self._call(self.client.close)
        if self.url.host is None:
            # Milvus Lite's server (and its lock on the file) outlives the client until
            # the process exits unless released: another process could not open it.
            from milvus_lite.server_manager import server_manager_instance

            assert self.url.path is not None
            await asyncio.to_thread(server_manager_instance.release_server, self.url.path)


def open_store(url: StoreUrl, catalogue: Any) -> MilvusVectors:
    try:
        return MilvusVectors(url)
    except Exception as exc:  # pymilvus raises its own and grpc's; all mean "not there"
        raise VectorStoreError(f"Milvus at {url.location} could not be opened: {exc}") from None
