"""The seams' tables: a backend registered once is what callers get, by name, and a
name no table holds is refused with the names it does hold."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from typer.testing import CliRunner

from herd import cli as herd_cli
from herd.app import App
from herd.cache.postgres import PostgresCacheStore
from herd.cache.redis import RedisCacheStore
from herd.cache.stores import cache_stores
from herd.config import Settings
from herd.errors import ConfigError
from herd.limits.postgres import PostgresLimiter
from herd.limits.redis import RedisLimiter
from herd.limits.registry import limiter_for
from herd.locks.postgres import PostgresLocks
from herd.locks.redis import RedisLocks
from herd.queue import registry
from herd.queue.base import Broker
from herd.queue.postgres import PostgresBroker
from herd.queue.redis import RedisBroker

PG = "postgresql://herd@127.0.0.1:1/herd"
REDIS = "redis://127.0.0.1:1/0"


def test_the_app_makes_the_broker_its_settings_name_and_the_limiter_follows_it():
    pg = App(settings=Settings(database_url=PG)).broker
    assert isinstance(pg, PostgresBroker) and pg.url == PG
    assert isinstance(limiter_for(pg), PostgresLimiter)
    red = App(settings=Settings(database_url=PG, redis_url=REDIS), broker="redis").broker
    assert isinstance(red, RedisBroker) and red.url == REDIS
    assert isinstance(limiter_for(red), RedisLimiter)
    with pytest.raises(ConfigError, match="redis broker needs HERD_REDIS_URL"):
        _ = App(settings=Settings(database_url=PG), broker="redis").broker
    with pytest.raises(ConfigError, match="unknown broker 'sqlite': use postgres or redis"):
        _ = App(settings=Settings(database_url=PG), broker="sqlite").broker


def test_a_registered_broker_is_one_entry_away(monkeypatch: pytest.MonkeyPatch):
    made: list[int] = []

    def factory(settings: Settings, database_url: Callable[[], str], pool_size: int) -> Broker:
        made.append(pool_size)
        return PostgresBroker(database_url(), pool_size=pool_size)

    monkeypatch.setitem(registry.BROKERS, "elsewhere", factory)
    app = App(settings=Settings(database_url=PG), broker="elsewhere", pool_size=5)
    assert isinstance(app.broker, PostgresBroker) and app.broker.url == PG
    assert made == [5]


def test_the_redis_broker_has_no_sql_transaction_to_fence():
    assert RedisBroker(REDIS).fenced_transaction(None) is None  # type: ignore[arg-type]


def test_the_cache_lives_where_herd_cache_names_and_its_locks_beside_it():
    store, locks = cache_stores(Settings(database_url=PG))
    assert isinstance(store, PostgresCacheStore) and isinstance(locks, PostgresLocks)
    store, locks = cache_stores(Settings(database_url=PG, cache="redis", redis_url=REDIS))
    assert isinstance(store, RedisCacheStore) and isinstance(locks, RedisLocks)
    with pytest.raises(ConfigError, match="HERD_CACHE=redis needs HERD_REDIS_URL"):
        cache_stores(Settings(database_url=PG, cache="redis"))
    # Before the table, any name but "redis" meant PostgreSQL without a word.
    with pytest.raises(ConfigError, match="unknown cache 'reddis' .*: use postgres or redis"):
        cache_stores(Settings(database_url=PG, cache="reddis"))


def test_the_cli_offers_the_brokers_the_table_holds(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(registry.BROKERS, "elsewhere", registry.BROKERS["postgres"])
    r = CliRunner().invoke(herd_cli.cli, ["--broker", "elsewhere", "config", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["broker"] == "elsewhere"
    r = CliRunner().invoke(herd_cli.cli, ["--broker", "sqlite", "config"], prog_name="herd")
    assert r.exit_code == 2
    assert "'sqlite' is not one of postgres, redis, elsewhere" in r.output
