"""Retrieval over HTTP: the k chunks nearest to each query text."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from herd.api.deps import HerdApp
from herd.api.models import Answer, CacheInfo, ErrorOut, Hit, QueryIn, QueryOut
from herd.api.security import TENANTS_KEY
from herd.config import Settings
from herd.errors import InvalidInput
from herd.rag.errors import IndexError_
from herd.rag.query import answer

router = APIRouter(tags=["retrieval"])


@router.post(
    "/query",
    response_model=QueryOut,
    responses={403: {"model": ErrorOut}, 404: {"model": ErrorOut}},
)
async def query(body: QueryIn, app: HerdApp, request: Request) -> QueryOut | JSONResponse:
    """The k best chunks for each text (``mode``: dense, lexical or hybrid), with
    references and scores, through the semantic cache unless ``cache`` is false
    (``answers[].cache`` says which); a text naming a unit gets it first. A token bound
    to tenants (HERD_API_TOKENS) queries as one of them (its only one by default), 403
    otherwise."""
    tenant = tenant_of(request, body)
    if isinstance(tenant, JSONResponse):
        return tenant
    check_bounds(app.settings, body)
    try:
        answers = await answer(
            app,
            body.collection,
            body.texts,
            body.k,
            cache=body.cache,
            tenant=tenant,
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
                match=a.match,
            )
            for a in answers
        ]
    )


def check_bounds(settings: Settings, body: QueryIn) -> None:
    """Refuse (422, the field named) a request past what one may ask: each text costs an
    embedding and a search, and k the bytes of the answer and of the cache's entry."""
    if len(body.texts) > settings.query_max_texts:
        raise InvalidInput(
            f"texts: {len(body.texts)} texts; one request may send {settings.query_max_texts}"
            " (HERD_QUERY_MAX_TEXTS): split them over several requests",
            field="texts",
        )
    for i, text in enumerate(body.texts):
        if len(text) > settings.query_max_chars:
            raise InvalidInput(
                f"texts.{i}: {len(text)} characters; a text may have"
                f" {settings.query_max_chars} (HERD_QUERY_MAX_CHARS): shorten it",
                field=f"texts.{i}",
            )
    if body.k > settings.query_max_k:
        raise InvalidInput(
            f"k: {body.k} hits asked; a request may ask {settings.query_max_k} (HERD_QUERY_MAX_K)",
            field="k",
        )


def tenant_of(request: Request, body: QueryIn) -> str | JSONResponse:
    """The tenant the request queries as, or a 403 when its token is not bound to it."""
    allowed: frozenset[str] | None = request.scope.get("state", {}).get(TENANTS_KEY)
    if allowed is None:  # HERD_API_TOKEN, or no token: any tenant
        return body.tenant
    if "tenant" not in body.model_fields_set and len(allowed) == 1:
        return next(iter(allowed))
    if body.tenant in allowed:
        return body.tenant
    shown = ", ".join(sorted(allowed))
    return JSONResponse(
        {"error": f"this token may query as {shown} only, not as {body.tenant!r}: name one"},
        status_code=403,
    )
