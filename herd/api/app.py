"""The FastAPI application: one herd App per server process, opened in the lifespan."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from herd._version import __version__
from herd.api import dashboard, docs, evals, jobs, metrics, queries, schedules
from herd.api.models import ErrorOut
from herd.api.security import (
    BearerAuth,
    BodyLimit,
    LocalOrTrusted,
    SameOrigin,
    SecurityHeaders,
    weakest,
    with_security_headers,
)
from herd.app import App
from herd.config import Settings
from herd.errors import (
    BatchNameTaken,
    BatchNotFound,
    BrokerError,
    BrokerUnavailable,
    DedupKeyHeld,
    HerdError,
    InvalidInput,
    JobNotFound,
    NotBatchOwner,
    NotDeadLettered,
    NotJSONSerializable,
    ScheduleNotFound,
)
from herd.masking import mask

log = logging.getLogger("herd.api")

# herd errors a client can act on, by the status that says so; the message is
# herd's own one line. Any other BrokerError may carry driver detail: logged only.
_STATUS: list[tuple[type[HerdError], int]] = [
    (JobNotFound, 404),
    (BatchNotFound, 404),
    (ScheduleNotFound, 404),
    (NotBatchOwner, 403),
    (BatchNameTaken, 409),
    (NotDeadLettered, 409),
    (DedupKeyHeld, 409),
    (NotJSONSerializable, 422),
]


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorOut, "description": description}


# Answers any route may give, documented on each so that a client (or a fuzzer)
# can check every 4xx against the schema; 422 replaces FastAPI's own shape.
ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("a Host name this server does not answer for, or a request herd refuses"),
    401: _error("missing or wrong bearer token"),
    403: _error(
        "a client off loopback with no token (or one under 16 characters) configured, a"
        " cross-site request, or a batch another caller made"
    ),
    413: _error("request body past HERD_API_BODY_LIMIT"),
    422: _error("a field or parameter is invalid: each is named with the reason"),
}


def create_app(
    source: Settings | App | None = None,
    *,
    token: str | None = None,
    body_limit: int | None = None,
    trusted_hosts: Sequence[str] | None = None,
) -> FastAPI:
    """The API over an App (opened here, closed by its owner) or over settings.

    ``token``, ``body_limit`` and ``trusted_hosts`` default to the settings
    (HERD_API_TOKEN, HERD_API_BODY_LIMIT, HERD_API_TRUSTED_HOSTS). Without a token of
    16 characters or more, only loopback clients are answered, however the server
    was started.
    """
    owned = not isinstance(source, App)
    herd_app = source if isinstance(source, App) else App(settings=source or Settings.from_env())
    settings = herd_app.settings
    token = (token if token is not None else settings.api_token or "").strip() or None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await herd_app.open()
        try:
            yield
        finally:
            if owned:
                await herd_app.close()

    api = FastAPI(
        title="herd",
        summary="A crash-safe worker queue with caches for expensive model work.",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,  # herd.api.docs serves it without a CDN
        redoc_url=None,
        responses=ERRORS,
    )
    api.state.herd = herd_app
    for module in (jobs, evals, queries, schedules, metrics, dashboard, docs):
        api.include_router(module.router)
    dashboard.mount_static(api)
    docs.mount_assets(api)
    _add_error_handlers(api)
    # Added innermost first: headers on every answer (403, 400, 401 and 413 too), then
    # who and which host name, then authentication before a byte of the body is read.
    api.add_middleware(BodyLimit, limit=body_limit or settings.api_body_limit)
    api.add_middleware(BearerAuth, token=token, bound=settings.api_tokens)
    api.add_middleware(SameOrigin)  # before a token is looked at: a page cannot send one
    hosts = settings.api_trusted_hosts if trusted_hosts is None else tuple(trusted_hosts)
    api.add_middleware(
        LocalOrTrusted,
        token=weakest([token, *(b.token for b in settings.api_tokens)]),
        trusted_hosts=hosts,
    )
    api.add_middleware(SecurityHeaders)
    return api


def _add_error_handlers(api: FastAPI) -> None:
    @api.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for e in exc.errors():
            where, *field = [str(part) for part in e.get("loc", ())] or ["body"]
            errors.append(
                {"field": ".".join(field) or where, "location": where, "reason": str(e["msg"])}
            )
        return JSONResponse({"error": "invalid request", "errors": errors}, status_code=422)

    @api.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        # FastAPI's own refusals (a body that is not UTF-8, no such route, a wrong
        # method) in herd's documented shape, not FastAPI's {"detail": ...}.
        return JSONResponse({"error": str(exc.detail)}, exc.status_code, headers=exc.headers)

    @api.exception_handler(HerdError)
    async def herd_error(request: Request, exc: HerdError) -> JSONResponse:
        for cls, status in _STATUS:
            if isinstance(exc, cls):
                body: dict[str, Any] = {"error": mask(str(exc))}
                if isinstance(exc, InvalidInput) and exc.field:  # the shape of a pydantic 422
                    body["errors"] = [
                        {"field": exc.field, "location": "body", "reason": mask(str(exc))}
                    ]
                return JSONResponse(body, status_code=status)
        if isinstance(exc, BrokerUnavailable):
            log.warning("%s %s: %s", request.method, request.url.path, exc)
            return JSONResponse({"error": "the job store is unavailable"}, status_code=503)
        if isinstance(exc, BrokerError):
            return _internal(request, exc)
        return JSONResponse({"error": mask(str(exc))}, status_code=400)

    @api.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        return _internal(request, exc)


def _internal(request: Request, exc: BaseException) -> JSONResponse:
    """The traceback stays in the server's log; the client gets an id to quote."""
    ref = uuid.uuid4().hex[:12]
    log.error("%s %s failed [%s]", request.method, request.url.path, ref, exc_info=exc)
    body: dict[str, Any] = {"error": f"internal error (reference {ref} in the server log)"}
    response = JSONResponse(body, status_code=500)
    # Starlette answers a 500 outside every middleware: the headers are added here.
    response.raw_headers = with_security_headers(response.raw_headers)
    return response
