"""Retrieval over HTTP: the k chunks nearest to each query text."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from herd.api.deps import HerdApp
from herd.api.models import Answer, CacheInfo, ErrorOut, Hit, QueryIn, QueryOut
from herd.rag.query import answer
from herd.rag.store import IndexError_

router = APIRouter(tags=["retrieval"])


@router.post("/query", response_model=QueryOut, responses={404: {"model": ErrorOut}})
async def query(body: QueryIn, app: HerdApp) -> QueryOut | JSONResponse:
    """The k best chunks for each text (``mode``: dense, lexical or hybrid), with
    references and scores, through the semantic cache unless ``cache`` is false
    (``answers[].cache`` says which); a text naming a unit gets it first."""
    try:
        answers = await answer(
            app,
            body.collection,
            body.texts,
            body.k,
            cache=body.cache,
            tenant=body.tenant,
            mode=body.mode,
        )
    except IndexError_ as exc:
        return JSONResponse({"error": str(exc)}, status_code=404)
    return QueryOut(
        answers=[
            Answer(
                query=a.query,
                hits=[Hit(**h) for h in a.hits],
                cache=CacheInfo(**info) if (info := a.cache_json()) else None,
            )
            for a in answers
        ]
    )
