"""The dashboard at /: an HTML page, a small script and a stylesheet (no build step).

The page and its files hold no data and need no token; the script fetches
/overview every 2 s with the bearer token the user typed (kept in sessionStorage,
so it dies with the tab), and renders with textContent only.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

router = APIRouter(include_in_schema=False)

# Script, style and fetches from this server only: an injected string in a job's
# payload cannot load or run anything, even if some rendering path went wrong.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)


@router.get("/")
async def page() -> HTMLResponse:
    html = resources.files("herd.api").joinpath("static/dashboard.html").read_text("utf-8")
    return HTMLResponse(html, headers={"content-security-policy": CSP})


def mount_static(api: FastAPI) -> None:
    api.mount("/static", StaticFiles(packages=[("herd.api", "static")]), name="static")
