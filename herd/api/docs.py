"""The API's documentation at /docs: Swagger UI, served by this server.

FastAPI's own page loads Swagger UI from a CDN and starts it with an inline
script; here its files come from the fastapi-offline package and the page's
script from herd/api/static, so the policy names no other origin and no inline
script.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

router = APIRouter(include_in_schema=False)

# Swagger UI sets styles from its script and draws icons from data: URLs; it
# fetches the schema from this server, and nothing else from anywhere.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline';"
    " img-src 'self' data:; connect-src 'self'; form-action 'none';"
    " frame-ancestors 'none'; base-uri 'none'"
)


@router.get("/docs")
async def page() -> HTMLResponse:
    html = resources.files("herd.api").joinpath("static/docs.html").read_text("utf-8")
    return HTMLResponse(html, headers={"content-security-policy": CSP})


def mount_assets(api: FastAPI) -> None:
    api.mount(
        "/docs/assets", StaticFiles(packages=[("fastapi_offline", "static")]), name="docs-assets"
    )
