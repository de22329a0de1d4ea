"""herd's tables appear in a database with a word, or not at all (HERD_AUTO_MIGRATE=0)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import psycopg
import pytest

from herd.config import Settings
from herd.db.postgres import migrate
from herd.errors import ConfigError
from tests.conftest import TEST_DB
from tests.helpers import fresh_database
from tests.test_cli import herd

# Named after the suite's database: another suite, or another xdist worker, has its own.
FRESH = f"{TEST_DB}_fresh_migrate"


@pytest.fixture
def fresh_db(pg_url: str) -> Iterator[str]:
    """An empty database of its own, on the suite's server, with a password in its URL
    (the embedded server trusts any)."""
    with fresh_database(pg_url, FRESH, password="s3cret-pw") as url:
        yield url


def has_tables(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT to_regclass('herd_migrations') IS NOT NULL").fetchone()
        return bool(row and row[0])


async def test_herds_first_tables_in_a_database_are_announced_once(fresh_db, caplog):
    caplog.set_level(logging.INFO, logger="herd.db")
    conn = await psycopg.AsyncConnection.connect(fresh_db, autocommit=True)
    async with conn:
        assert await migrate(conn, "herd.queue.sql")
        assert await migrate(conn, "herd.locks.sql")  # more tables, no second word
    said = [r for r in caplog.records if "creating herd's tables" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    line = said[0].getMessage()
    assert f"database {FRESH!r}" in line and "s3cret-pw" not in line


def test_auto_migrate_off_refuses_to_create_tables_until_herd_migrate(fresh_db):
    refused = herd("status", "--json", url=fresh_db, HERD_AUTO_MIGRATE="0")
    assert refused.returncode == 1, refused.stderr
    assert "HERD_AUTO_MIGRATE=0" in refused.stderr and "`herd migrate`" in refused.stderr
    assert FRESH in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert not has_tables(fresh_db)
    done = herd("migrate", url=fresh_db, HERD_AUTO_MIGRATE="0")
    assert done.returncode == 0, done.stderr
    assert "creating herd's tables" in done.stderr and "s3cret-pw" not in done.stderr
    works = herd("status", "--json", url=fresh_db, HERD_AUTO_MIGRATE="0")
    assert works.returncode == 0, works.stderr


def test_herd_config_shows_auto_migrate():
    assert Settings.from_env({}).masked()["auto_migrate"] == "True"
    assert Settings.from_env({"HERD_AUTO_MIGRATE": "0"}).masked()["auto_migrate"] == "False"
    with pytest.raises(ConfigError, match="HERD_AUTO_MIGRATE must be 1 or 0"):
        Settings.from_env({"HERD_AUTO_MIGRATE": "maybe"})
