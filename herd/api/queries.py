"""Retrieval over HTTP: the k chunks nearest to each query text."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from herd.api.deps import HerdApp
from herd.api.models import Answer, ErrorOut, Hit, QueryIn, QueryOut
from herd.app import App
from herd.rag.ingest import RagRuntime
from herd.rag.store import IndexError_

router = APIRouter(tags=["retrieval"])


async def search(app: App, collection: str, texts: list[str], k: int) -> list[Answer]:
    """Embed the texts and search the collection's live index generation."""
    rt = await RagRuntime.of(app)
    gen = await rt.store.live(collection)
    if gen is None:
        raise IndexError_(f"collection {collection!r} has no index yet: run herd ingest first")
    if gen.settings.get("embedder") != rt.embedder.id:
        raise IndexError_(
            f"collection {collection!r} was indexed with {gen.settings.get('embedder')},"
            f" not {rt.embedder.id}: re-run herd ingest to build a matching generation"
        )
    vectors = await asyncio.to_thread(rt.embedder.embed, texts)
    answers = []
    for text, vector in zip(texts, vectors, strict=True):
        hits = await rt.store.search(gen, vector, k)
        answers.append(
            Answer(
                query=text,
                hits=[
                    Hit(id=h.chunk_id, ref=h.breadcrumb, score=round(h.score, 4), text=h.text)
                    for h in hits
                ],
            )
        )
    return answers


# The one call the query route makes: a cache in front of retrieval replaces it here.
answer = search


@router.post("/query", response_model=QueryOut, responses={404: {"model": ErrorOut}})
async def query(body: QueryIn, app: HerdApp) -> QueryOut | JSONResponse:
    """The k nearest chunks to each text, with references and cosine scores."""
    try:
        return QueryOut(answers=await answer(app, body.collection, body.texts, body.k))
    except IndexError_ as exc:
        return JSONResponse({"error": str(exc)}, status_code=404)
