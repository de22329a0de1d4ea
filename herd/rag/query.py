"""Answering queries: the k best chunks for each text, through the semantic cache.

One function for every front end (`herd query`, `POST /query`, Python), so that
the checks on the collection and the cache's rules are the same everywhere.

Three modes: ``dense`` (cosine over the generation's vectors), ``lexical`` (BM25
over its lexemes) and ``hybrid`` (both, fused: ``herd.rag.fusion``). Whatever the
mode, a query that names a unit (``John 3:16``, ``Pasal 5 ayat (2)``, a chunk id;
``herd.rag.references``) gets that unit first when the collection has it. The
cache keeps each mode's answers apart (and each fusion's).

Each answer says how close it came (``Answer.match``): ``weak`` when the query's best
cosine over the collection is below what the embedder's kind gives unrelated
questions (``herd.rag.embedders.spec``, ``Kind.weak_below``) and, in the modes that
match words, BM25 found less than ``fusion.FOUND_ENOUGH`` of the query (a rare name
the embedder blurs is still a match); ``strong`` otherwise, and always when the query
names a unit the collection has.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from herd.app import App
from herd.errors import InvalidInput
from herd.jsonvalue import JSON, check_text
from herd.rag import fusion as fusions
from herd.rag import references
from herd.rag.embedders import spec as specs
from herd.rag.embedders.base import embed_queries
from herd.rag.errors import IndexError_
from herd.rag.ingest import RagRuntime
from herd.rag.store import Generation, Hit
from herd.semantic.cache import SemanticHit
from herd.semantic.runtime import query_cache

T = TypeVar("T")

# Entries keep a few more hits than asked, so that -k 3 and -k 5 share them.
CACHED_K = 10
MODES = ("dense", "lexical", "hybrid")
DEFAULT_MODE = "hybrid"
"""The mode that won bench/retrieval.py over all its queries (docs/retrieval.md)."""
RANKING = 3
"""In every cache scope: answers cached by a herd that ranked or judged ``match``
otherwise (1: before spelling variants, the lexical weight that follows what BM25
found, and ``match``; 2: before that weight spared queries dense has nothing close
to) are not served by this one."""
CANDIDATES = 50
"""How deep each ranking goes before fusion: a chunk ranked 40th by one and 3rd
by the other must be seen by both."""


Match = Literal["strong", "weak"]
STRONG: Match = "strong"
WEAK: Match = "weak"


@dataclass(frozen=True)
class Answer:
    query: str
    hits: list[dict[str, Any]]  # id, ref, score, text; page, page_end (from a PDF)
    cache: SemanticHit | None  # None: the cache was not asked
    match: Match = STRONG
    """``weak``: nothing in the collection is close to the query (see the module)."""

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
    mode: str = DEFAULT_MODE,
    embedder: str | None = None,
    fusion: str | None = None,
) -> list[Answer]:
    """Search the collection's live generation; raises IndexError_ when it cannot.

    ``embedder`` (a spec, else ``HERD_EMBEDDER``) must be the collection's own when
    given; by default the collection's is used. ``fusion`` (hybrid only): ``rrf`` or
    ``weighted``, else ``HERD_RAG_FUSION``, else ``weighted``. A collection name no store
    keeps (NUL, lone surrogate), an unknown mode or fusion raise InvalidInput.
    """
    check_text(collection, "collection")
    check_text(tenant, "tenant")
    for i, q in enumerate(queries):
        check_text(q, f"queries[{i}]")
    if mode not in MODES:
        raise InvalidInput(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    how = fusions.chosen(fusion) if mode == "hybrid" else ""
    rt = await RagRuntime.of(app)
    gen = await rt.store.live(collection)
    if gen is None:
        raise IndexError_(f"collection {collection!r} has no index yet: run herd ingest first")
    model = await rt.embedder_for(_spec_of(gen, embedder), gen.settings.get("embedder"))
    if gen.settings.get("embedder") != model.id:
        raise IndexError_(
            f"collection {collection!r} was indexed with {gen.settings.get('embedder')},"
            f" not {model.id}: re-run herd ingest to build a matching generation"
        )
    vectors = await embed_slots(app).run(embed_queries, model, queries)
    weak_below = specs.kind_of(specs.recorded_spec(gen.settings)).weak_below

    async def retrieve(i: int, n: int) -> JSON:
        hits, match = await _ranked(rt, gen, queries[i], vectors[i], n, mode, how, weak_below)
        return {"k": n, "hits": [_hit(h) for h in hits], "match": match}

    if not cache:
        plain: list[Any] = [await retrieve(i, k) for i in range(len(queries))]
        return [Answer(q, v["hits"], None, v["match"]) for q, v in zip(queries, plain, strict=True)]
    semantic = await query_cache(app, model)
    scope = f"{gen.id}/{mode}" + (f"/{how}" if how else "") + f"/r{RANKING}"
    out = []
    for i, q in enumerate(queries):
        found = await semantic.aget_or_compute(
            q,
            functools.partial(retrieve, i, max(k, CACHED_K)),
            vector=vectors[i],
            tenant=tenant,
            collection=collection,
            generation=scope,  # a mode's answers are not another's
        )
        value: Any = found.value
        # Cached by a run with a larger -k than this bound allows, or before answers
        # said how close they came.
        if value["k"] < k or "match" not in value:
            value = await retrieve(i, k)
        out.append(Answer(q, value["hits"][:k], found, value["match"]))
    return out


class EmbedSlots:
    """At most ``size`` query embeddings at once in a process (HERD_QUERY_EMBED_CONCURRENCY),
    each in a thread: the others wait their turn, and the server keeps threads and cores
    for everything else. ``running`` and ``waiting`` count them."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = asyncio.Semaphore(size)
        self.running = self.waiting = 0

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        self.waiting += 1
        try:
            await self._free.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        # Freed when the thread ends, not when a cancelled caller stops waiting for it:
        # the bound counts threads at work.
        work.add_done_callback(self._done)
        return await asyncio.shield(work)

    def _done(self, _: asyncio.Future[Any]) -> None:
        self.running -= 1
        self._free.release()


def embed_slots(app: App) -> EmbedSlots:
    """The app's EmbedSlots (one per app: a server's requests share it)."""
    slots = app.state.get("rag.embed_slots")
    if slots is None:
        slots = app.state["rag.embed_slots"] = EmbedSlots(app.settings.query_embed_concurrency)
    assert isinstance(slots, EmbedSlots)
    return slots


def _spec_of(gen: Generation, asked: str | None) -> str:
    own = specs.recorded_spec(gen.settings)
    requested = specs.requested(asked)
    if requested is not None and specs.canonical(requested) != own:
        raise IndexError_(
            f"collection {gen.collection!r} is indexed with embedder {own}, not"
            f" {specs.canonical(requested)}: query it without --embedder, or re-index it"
            f" with herd ingest --embedder {requested} --new-generation"
        )
    return own


async def _ranked(
    rt: RagRuntime,
    gen: Generation,
    text: str,
    vector: Any,
    n: int,
    mode: str,
    how: str,
    weak_below: float | None,
) -> tuple[list[Hit], Match]:
    """The n best chunks, and whether the best is close to the query (``match``)."""
    named = await rt.store.units(gen.collection, references.patterns(text))
    if not any(references.is_elucidation(p) for p in references.patterns(text)):
        named = [h for h in named if not references.is_elucidation(h.chunk_id)]
    depth = max(n, CANDIDATES) if mode == "hybrid" else n
    dense = await rt.store.search(gen, vector, depth) if mode != "lexical" else []
    lexical = await rt.store.search_lexical(gen, text, depth) if mode != "dense" else []
    close = weak_below is None or bool(dense) and dense[0].score >= weak_below
    ranked = (
        fusions.fuse(dense, lexical, how, dense_close=close)
        if mode == "hybrid"
        else dense or lexical
    )
    first = {h.chunk_id for h in named}
    hits = (named + [h for h in ranked if h.chunk_id not in first])[:n]
    match = STRONG
    if weak_below is not None and not named:
        # Far by the embedder (whatever ranked the answer: BM25 has no scale on which
        # "far" could be read), and, where words were matched, too few of the query's.
        nearest = dense[:1] if mode != "lexical" else await rt.store.search(gen, vector, 1)
        far = not nearest or nearest[0].score < weak_below
        found = max((h.found or 0.0 for h in lexical), default=0.0)
        if far and found < fusions.FOUND_ENOUGH:
            match = WEAK
    return hits, match


def _hit(h: Hit) -> dict[str, Any]:
    hit = {"id": h.chunk_id, "ref": h.breadcrumb, "score": round(h.score, 4), "text": h.text}
    # Where a chunk of a PDF is: the pages an answer can be checked on.
    hit.update({k: h.metadata[k] for k in ("page", "page_end") if k in (h.metadata or {})})
    return hit
