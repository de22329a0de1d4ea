"""Fixtures of the API tests: a herd App on a real store, the API over it in-process
(httpx's ASGI transport) or as a real `herd serve` process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import pytest

from herd.api import create_app
from herd.app import App
from herd.config import Settings
from tests.conftest import flush_redis, truncate
from tests.helpers import STARTUP, eventually_sync
from tests.llm.conftest import clean_eval_tables

TOKEN = "s3cret-token-for-tests"


def clean_side_tables(url: str) -> None:
    """The ledger and the exact cache live beside the jobs; each test starts without them."""
    clean_eval_tables(url)


@pytest.fixture
async def pg_app(pg_url: str, herd_home: Path) -> AsyncIterator[App]:
    truncate(pg_url)
    app = App(settings=Settings(home=herd_home, database_url=pg_url))
    async with app:
        clean_side_tables(pg_url)
        yield app


@pytest.fixture(params=["postgres", "redis"])
async def any_app(
    request: pytest.FixtureRequest, pg_url: str, herd_home: Path
) -> AsyncIterator[App]:
    """A herd App on each broker (the cache and the ledger stay on PostgreSQL)."""
    truncate(pg_url)
    settings = Settings(home=herd_home, database_url=pg_url, broker=request.param)
    if request.param == "redis":
        url = request.getfixturevalue("redis_stack")
        flush_redis(url)
        settings = settings.override(redis_url=url)
    app = App(settings=settings)
    async with app:
        clean_side_tables(pg_url)
        yield app


@asynccontextmanager
async def client_of(
    app: App,
    *,
    peer: tuple[str, int] = ("127.0.0.1", 50000),
    base_url: str = "http://127.0.0.1:8000",
    **kw: object,
) -> AsyncIterator[httpx.AsyncClient]:
    """The API over ``app``, lifespan included, called in-process from the address ``peer``."""
    api = create_app(app, **kw)  # type: ignore[arg-type]
    async with api.router.lifespan_context(api):
        transport = httpx.ASGITransport(app=api, client=peer)
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as client:
            yield client


@pytest.fixture
async def client(pg_app: App) -> AsyncIterator[httpx.AsyncClient]:
    async with client_of(pg_app) as c:
        yield c


@pytest.fixture
async def any_client(any_app: App) -> AsyncIterator[httpx.AsyncClient]:
    async with client_of(any_app) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def herd_env(pg_url: str, herd_home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
    return {**env, "HERD_DATABASE_URL": pg_url, "HERD_HOME": str(herd_home), **extra}


@contextmanager
def serving(
    pg_url: str,
    herd_home: Path,
    log_path: Path,
    *,
    command: list[str] | None = None,
    **env: str,
) -> Iterator[str]:
    """A real `herd serve` process (or ``command``, given the port) on a free port,
    answering on loopback; yields its base URL."""
    port = free_port()
    log = log_path.open("w")
    argv = command or [sys.executable, "-m", "herd", "serve"]
    proc = subprocess.Popen(
        [*argv, "--port", str(port)],
        env=herd_env(pg_url, herd_home, **env),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    headers = (
        {"Authorization": f"Bearer {env['HERD_API_TOKEN']}"} if "HERD_API_TOKEN" in env else {}
    )

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"herd serve exited: {log_path.read_text()}")
        try:
            return httpx.get(url + "/healthz", headers=headers, timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        # How long a process takes to start is not what any test here measures: the
        # deadline is a safety net for a loaded machine (it fails at once if it exits).
        eventually_sync(up, timeout=STARTUP, interval=0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def server(pg_url: str, herd_home: Path, tmp_path: Path) -> Iterator[str]:
    with serving(pg_url, herd_home, tmp_path / "serve.log") as url:
        yield url
