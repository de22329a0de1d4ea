"""herd behind PgBouncer in transaction mode (the contract suite and the crash test
run through it too, as backend "pgbouncer"): notifications need a session, so they
go to HERD_DATABASE_DIRECT_URL; the settings of the connection layer."""

from __future__ import annotations

import asyncio
import json
import time

import psycopg
import pytest

from herd.config import PG_POOL_SIZE, PG_POOL_SPARE, Settings, pool_size
from herd.db.postgres import behind_pooler
from herd.errors import ConfigError
from herd.queue.postgres import PostgresBroker
from tests.conftest import truncate
from tests.helpers import job
from tests.test_cli import herd


async def test_a_notify_wakes_a_waiter_through_pgbouncer_via_the_direct_url(pgbouncer_url, pg_url):
    truncate(pg_url)
    broker = PostgresBroker(pgbouncer_url, direct_url=pg_url)
    await broker.open()
    try:
        # The first wait connects the listener; wait until it listens.
        await broker.wait_for_jobs(["q"], timeout=0.01)
        await asyncio.wait_for(broker._pool.listener.connected.wait(), 10)
        waiting = asyncio.create_task(broker.wait_for_jobs(["q"], timeout=60))
        await asyncio.sleep(0)  # let it subscribe
        started = time.monotonic()
        await broker.enqueue([job(queue="q")])
        await asyncio.wait_for(waiting, 90)
        # Through the pooler alone the NOTIFY is lost and the wait runs its 60 s.
        assert time.monotonic() - started < 30
    finally:
        await broker.close()


async def test_the_pooler_is_detected_and_only_there_statements_are_not_prepared(
    pgbouncer_url, pg_url
):
    for url, pooled in ((pgbouncer_url, True), (pg_url, False)):
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        async with conn:
            assert await behind_pooler(conn) is pooled
        broker = PostgresBroker(url)
        await broker.open()
        try:
            async with broker._pool.connection() as conn:
                assert (conn.prepare_threshold is None) is pooled
            # The same statement many times over: prepared, it would fail through PgBouncer
            # on the next server connection.
            for _ in range(12):
                await broker.stats()
        finally:
            await broker.close()


def test_pool_size_setting_and_its_default_for_a_worker():
    assert Settings.from_env({"HERD_PG_POOL_SIZE": "12"}).pg_pool_size == 12
    assert pool_size(Settings.from_env({"HERD_PG_POOL_SIZE": "12"}), 50) == 12
    assert pool_size(Settings.from_env({}), 6) == 6 + PG_POOL_SPARE
    assert pool_size(Settings.from_env({})) == PG_POOL_SIZE
    for bad in ("0", "-3", "many"):
        with pytest.raises(ConfigError, match="HERD_PG_POOL_SIZE must be a positive number"):
            Settings.from_env({"HERD_PG_POOL_SIZE": bad})


def test_a_bad_pool_size_is_a_one_line_usage_error_and_the_direct_url_is_masked():
    bad = herd("config", HERD_PG_POOL_SIZE="lots")
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "HERD_PG_POOL_SIZE" in bad.stderr
    ok = herd(
        "config",
        "--json",
        HERD_DATABASE_DIRECT_URL="postgresql://u:hunter2@db-direct/x",
        HERD_PG_POOL_SIZE="9",
    )
    values = json.loads(ok.stdout)
    assert values["database_direct_url"] == "postgresql://u:****@db-direct/x"
    assert values["pg_pool_size"] == "9" and "hunter2" not in ok.stdout
