"""Qdrant: a server or qdrant-client's local mode (``qdrant://``), or the embedded
engine of qdrant-edge (``qdrant+edge://``).

A generation is a collection (server, local mode) or a shard of its own in a
folder under the store's path (edge). Each point is a chunk: its id a UUID
derived from the chunk id, its payload the chunk id, hash and fencing token.

Fencing: every upsert carries a condition, ``token <= this write's``, which
Qdrant checks per point as it writes (a conditional upsert: a point whose stored
token is newer is left alone, a new point is inserted). A stale writer therefore
never overwrites a newer one's vector, whatever the interleaving; on the server
that holds across processes and clients, in local mode and edge within the one
process that may open the folder.

Swap: on a server and in local mode, the collection's alias (``herd_<name>``,
for other readers) moves to the new generation in one aliases request, after
herd's catalogue has swapped; edge has no aliases, its catalogue pointer is the
alias. Durability: the server and edge write a WAL before answering; local mode
persists each write to its folder.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from herd.rag.vectors.base import Row, Space, StoreUrl, VectorStoreError
from herd.rag.vectors.engine import SCROLL, Threaded, alias, gone


def point_id(chunk_id: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"herd:{chunk_id}"))


def payload(row: Row, token: int) -> dict[str, Any]:
    return {"chunk_id": row.chunk_id, "hash": row.hash, "token": token}


class QdrantVectors(Threaded):
    joins_transaction = False

    def __init__(self, url: StoreUrl) -> None:
        super().__init__()
        from qdrant_client import QdrantClient, models

        self.url, self.m = url, models
        if url.host is None:
            assert url.path is not None
            Path(url.path).mkdir(parents=True, exist_ok=True)
            self.client = QdrantClient(path=url.path)
        else:
            self.client = QdrantClient(
                host=url.host, port=url.port, api_key=url.password, https=False, timeout=60
            )

    async def create(self, conn: Any, space: Space) -> None:
        def create() -> None:
            if self.client.collection_exists(space.name):
                return
            self.client.create_collection(
                space.name,
                vectors_config=self.m.VectorParams(size=space.dim, distance=self.m.Distance.COSINE),
            )
            if self.url.host is not None:  # local mode keeps no payload indexes
                self.client.create_payload_index(
                    space.name, "token", self.m.PayloadSchemaType.INTEGER
                )

        await self._call(create)

    async def upsert(self, conn: Any, space: Space, rows: Sequence[Row], token: int) -> int:
        if not rows:
            return 0
        m = self.m
        points = [
            m.PointStruct(
                id=point_id(r.chunk_id),
                vector=np.asarray(r.vector, dtype=np.float32).tolist(),
                payload=payload(r, token),
            )
            for r in rows
        ]
        newer_not = m.Filter(must=[m.FieldCondition(key="token", range=m.Range(lte=token))])
        await self._call(self.client.upsert, space.name, points, wait=True, update_filter=newer_not)
        return len(rows)

    async def prepare(self, space: Space) -> None:
        pass  # the server's optimizer indexes as segments fill; local mode searches exactly

    async def inventory(self, space: Space) -> dict[str, str]:
        def scroll() -> dict[str, str]:
            out: dict[str, str] = {}
            offset: Any = None
            while True:
                points, offset = self.client.scroll(
                    space.name,
                    limit=SCROLL,
                    offset=offset,
                    with_payload=["chunk_id", "hash"],
                    with_vectors=False,
                )
                for p in points:
                    assert p.payload is not None
                    out[str(p.payload["chunk_id"])] = str(p.payload["hash"])
                if offset is None:
                    return out

        return await self._call(scroll)

    async def search(
        self, space: Space, vector: np.ndarray, k: int, ef: int
    ) -> list[tuple[str, float]]:
        def query() -> list[tuple[str, float]]:
            if not self.client.collection_exists(space.name):
                raise gone(space)
            found = self.client.query_points(
                space.name,
                query=np.asarray(vector, dtype=np.float32).tolist(),
                limit=k,
                with_payload=["chunk_id"],
                # Local mode searches exactly and warns at any search parameter.
                search_params=self._params(ef, k),
            ).points
            return [(str(p.payload["chunk_id"]), float(p.score)) for p in found if p.payload]

        return await self._call(query)

    def _params(self, ef: int, k: int) -> Any:
        return None if self.url.host is None else self.m.SearchParams(hnsw_ef=max(ef, k))

    async def delete(self, space: Space, chunk_ids: Sequence[str]) -> None:
        if chunk_ids:
            ids: list[Any] = [point_id(c) for c in chunk_ids]
            await self._call(
                self.client.delete, space.name, self.m.PointIdsList(points=ids), wait=True
            )

    async def publish(self, space: Space) -> None:
        m, name = self.m, alias(space.collection)

        def move() -> None:
            current = {a.alias_name for a in self.client.get_aliases().aliases}
            ops: list[Any] = []
            if name in current:
                ops.append(m.DeleteAliasOperation(delete_alias=m.DeleteAlias(alias_name=name)))
            ops.append(
                m.CreateAliasOperation(
                    create_alias=m.CreateAlias(collection_name=space.name, alias_name=name)
                )
            )
            # One request: readers of the alias see the old collection or the new one.
            self.client.update_collection_aliases(ops)

        await self._call(move)

    async def drop(self, space: Space) -> None:
        await self._call(self.client.delete_collection, space.name)

    async def close(self) -> None:
        await self._call(self.client.close)


_OPTIMIZE = (
    "import sys, qdrant_edge as qe\n"
    "shard = qe.EdgeShard.load(sys.argv[1])\n"
    "shard.optimize()\n"
    "shard.flush()\n"
    "shard.close()\n"
)


class EdgeVectors(Threaded):
    """qdrant-edge: a shard per generation in ``<path>/herd_g<id>``, opened once per process."""

    joins_transaction = False

    def __init__(self, url: StoreUrl) -> None:
        super().__init__()
        import qdrant_edge

        assert url.path is not None
        self.url, self.qe, self.root = url, qdrant_edge, Path(url.path)
        self.root.mkdir(parents=True, exist_ok=True)
        self._shards: dict[int, Any] = {}

    def _shard(self, space: Space, *, create: bool = False) -> Any:
        shard = self._shards.get(space.id)
        if shard is not None:
            return shard
        qe, path = self.qe, self.root / space.name
        if path.exists():
            shard = qe.EdgeShard.load(str(path))
        elif create:
            config = qe.EdgeConfig(
                vectors={"": qe.EdgeVectorParams(size=space.dim, distance=qe.Distance.Cosine)}
            )
            shard = qe.EdgeShard.create(str(path), config)
        else:
            raise gone(space)
        self._shards[space.id] = shard
        return shard

    async def create(self, conn: Any, space: Space) -> None:
        await self._call(self._shard, space, create=True)

    async def upsert(self, conn: Any, space: Space, rows: Sequence[Row], token: int) -> int:
        if not rows:
            return 0
        qe = self.qe
        points = [
            qe.Point(
                point_id(r.chunk_id),
                np.asarray(r.vector, dtype=np.float32).tolist(),
                payload(r, token),
            )
            for r in rows
        ]
        newer_not = qe.Filter(
            must=[qe.FieldCondition(key="token", range=qe.RangeFloat(lte=float(token)))]
        )
        operation = qe.UpdateOperation.upsert_points(points, condition=newer_not)
        await self._call(lambda: self._shard(space).update(operation))
        return len(rows)

    async def prepare(self, space: Space) -> None:
        def optimize() -> None:
            # optimize() (merging segments, building the HNSW graph) holds the GIL for
            # its whole run, over a minute for the KJV on a busy machine: in this process
            # it would stop the event loop, so the finalize job's heartbeats, and the job
            # lost its lease and ran again. A child process builds it instead; the shard
            # is closed here meanwhile (its folder is one process's), reopened on next use.
            shard = self._shards.pop(space.id, None)
            if shard is not None:
                shard.close()
            path = self.root / space.name
            if not path.exists():
                raise gone(space)
            done = subprocess.run(
                [sys.executable, "-c", _OPTIMIZE, str(path)], capture_output=True, text=True
            )
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise VectorStoreError(f"qdrant-edge at {path}: optimize failed: {last}")

        await self._call(optimize)

    async def inventory(self, space: Space) -> dict[str, str]:
        qe = self.qe

        def scroll() -> dict[str, str]:
            shard, out, offset = self._shard(space), {}, None
            while True:
                records, offset = shard.scroll(
                    qe.ScrollRequest(limit=SCROLL, offset=offset, with_payload=True)
                )
                for r in records:
                    out[str(r.payload["chunk_id"])] = str(r.payload["hash"])
                if offset is None:
                    return out

        return await self._call(scroll)

    async def search(
        self, space: Space, vector: np.ndarray, k: int, ef: int
    ) -> list[tuple[str, float]]:
        qe = self.qe
        request = qe.QueryRequest(
            limit=k,
            query=qe.Query.Nearest(np.asarray(vector, dtype=np.float32).tolist()),
            with_payload=["chunk_id"],
            params=qe.SearchParams(hnsw_ef=max(ef, k)),
        )
        found = await self._call(lambda: self._shard(space).query(request))
        return [(str(p.payload["chunk_id"]), float(p.score)) for p in found if p.payload]

    async def delete(self, space: Space, chunk_ids: Sequence[str]) -> None:
        if chunk_ids:
            operation = self.qe.UpdateOperation.delete_points([point_id(c) for c in chunk_ids])
            await self._call(lambda: self._shard(space).update(operation))

    async def publish(self, space: Space) -> None:
        pass  # no aliases in edge: herd_collections.live_generation is the pointer

    async def drop(self, space: Space) -> None:
        def drop() -> None:
            shard = self._shards.pop(space.id, None)
            if shard is not None:
                shard.close()
            shutil.rmtree(self.root / space.name, ignore_errors=True)

        await self._call(drop)

    async def close(self) -> None:
        def close() -> None:
            for shard in self._shards.values():
                shard.close()
            self._shards.clear()

        await self._call(close)


def open_server_or_local(url: StoreUrl, catalogue: Any) -> QdrantVectors:
    try:
        return QdrantVectors(url)
    except RuntimeError as exc:  # local mode: the folder is another process's
        raise VectorStoreError(f"Qdrant at {url.location}: {exc}") from None


def open_edge(url: StoreUrl, catalogue: Any) -> EdgeVectors:
    try:
        return EdgeVectors(url)
    except RuntimeError as exc:  # the folder is another process's
        raise VectorStoreError(f"Qdrant at {url.location}: {exc}") from None
