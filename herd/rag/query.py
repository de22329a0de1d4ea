"""Answering queries: the k chunks nearest to each text, through the semantic cache.

One function for every front end (`herd query`, `POST /query`, Python), so that
the checks on the collection and the cache's rules are the same everywhere.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

from herd.app import App
from herd.jsonvalue import JSON, check_text
from herd.rag.ingest import RagRuntime
from herd.rag.store import Hit, IndexError_
from herd.semantic.cache import SemanticHit
from herd.semantic.runtime import query_cache

# Entries keep a few more hits than asked, so that -k 3 and -k 5 share them.
CACHED_K = 10


@dataclass(frozen=True)
class Answer:
    query: str
    hits: list[dict[str, Any]]  # id, ref, score, text
    cache: SemanticHit | None  # None: the cache was not asked

    @property
    def cached(self) -> bool:
        return self.cache is not None and self.cache.source not in ("computed", "early")

    def cache_json(self) -> dict[str, Any] | None:
        if self.cache is None:
            return None
        return {
            "hit": self.cached,
            "source": self.cache.source,
            "similarity": round(self.cache.similarity, 4) if self.cached else None,
            "cached_query": self.cache.query if self.cached else None,
        }


async def answer(
    app: App,
    collection: str,
    queries: list[str],
    k: int,
    *,
    cache: bool = True,
    tenant: str = "default",
) -> list[Answer]:
    """Search the collection's live generation; raises IndexError_ when it cannot.

    A collection name no store keeps (NUL, lone surrogate) raises InvalidInput.
    """
    check_text(collection, "collection")
    check_text(tenant, "tenant")
    for i, q in enumerate(queries):
        check_text(q, f"queries[{i}]")
    rt = await RagRuntime.of(app)
    gen = await rt.store.live(collection)
    if gen is None:
        raise IndexError_(f"collection {collection!r} has no index yet: run herd ingest first")
    if gen.settings.get("embedder") != rt.embedder.id:
        raise IndexError_(
            f"collection {collection!r} was indexed with {gen.settings.get('embedder')},"
            f" not {rt.embedder.id}: re-run herd ingest to build a matching generation"
        )
    vectors = await asyncio.to_thread(rt.embedder.embed, queries)

    async def retrieve(i: int, n: int) -> JSON:
        hits = await rt.store.search(gen, vectors[i], n)
        return {"k": n, "hits": [_hit(h) for h in hits]}

    if not cache:
        plain: list[Any] = [await retrieve(i, k) for i in range(len(queries))]
        return [Answer(q, v["hits"], None) for q, v in zip(queries, plain, strict=True)]
    semantic = await query_cache(app, rt.embedder)
    out = []
    for i, q in enumerate(queries):
        found = await semantic.aget_or_compute(
            q,
            functools.partial(retrieve, i, max(k, CACHED_K)),
            vector=vectors[i],
            tenant=tenant,
            collection=collection,
            generation=gen.id,
        )
        value: Any = found.value
        if value["k"] < k:  # cached by a run with a larger -k than this bound allows
            value = await retrieve(i, k)
        out.append(Answer(q, value["hits"][:k], found))
    return out


def _hit(h: Hit) -> dict[str, Any]:
    return {"id": h.chunk_id, "ref": h.breadcrumb, "score": round(h.score, 4), "text": h.text}
