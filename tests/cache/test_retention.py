"""Exact-cache retention and statistics that cost the same whatever the cache holds."""

from __future__ import annotations

import psycopg
import pytest
import redis

from herd import App
from herd.cache import PostgresCacheStore, RedisCacheStore
from herd.config import Settings
from herd.llm.eval import EvalRuntime
from tests.conftest import flush_redis
from tests.helpers import eventually


@pytest.fixture
async def pg_store(pg_url):
    store = PostgresCacheStore(pg_url, purge_every=0)  # purged by the tests only
    await store.open()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("TRUNCATE herd_cache, herd_cache_stats")
    yield store
    await store.close()


def pg_count(url: str) -> dict[str, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT namespace, count(*) FROM herd_cache GROUP BY 1").fetchall()
    return dict(rows)


async def test_postgres_purges_expired_entries_and_keeps_live_ones(pg_store, pg_url):
    for i in range(5):
        await pg_store.put("a", f"old{i}", {"i": i}, delta=0, ttl=60)
    await pg_store.put("a", "stale-ok", 1, delta=0, ttl=60, keep_stale=3600)
    await pg_store.put("a", "live", 1, delta=0, ttl=3600)
    await pg_store.put("b", "forever", 1, delta=0, ttl=None)
    with psycopg.connect(pg_url, autocommit=True) as conn:  # an hour later
        conn.execute(
            "UPDATE herd_cache SET expires_at = expires_at - interval '1 hour',"
            " keep_until = keep_until - interval '1 hour' WHERE key LIKE 'old%' OR key = 'stale-ok'"
        )
    assert await pg_store.get("a", "old0") is None  # reads ignore what expired
    assert await pg_store.purge(batch=2) == 5  # in batches smaller than the work
    assert pg_count(pg_url) == {"a": 2, "b": 1}
    assert (await pg_store.get("a", "stale-ok", stale_for=3600)) is not None
    stats = await pg_store.stats()
    assert {ns: s["entries"] for ns, s in stats.items()} == pg_count(pg_url)


async def test_postgres_entry_counts_follow_every_write(pg_store, pg_url):
    await pg_store.put("a", "k1", 1, delta=0, ttl=None)
    await pg_store.put("a", "k1", 2, delta=0, ttl=None)  # an overwrite is no new entry
    await pg_store.put("a", "k2", 1, delta=0, ttl=None)
    await pg_store.put("b", "k1", 1, delta=0, ttl=None)
    assert (await pg_store.stats())["a"]["entries"] == 2
    await pg_store.delete("a", "k1")
    await pg_store.delete("a", "missing")
    assert (await pg_store.stats())["a"]["entries"] == 1
    assert await pg_store.clear() == 2
    assert {ns: s["entries"] for ns, s in (await pg_store.stats()).items()} == {"a": 0, "b": 0}


def scans(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))


async def test_redis_stats_count_entries_exactly_without_a_scan(redis_stack):
    flush_redis(redis_stack)
    store = RedisCacheStore(redis_stack)
    await store.open()
    client = redis.Redis.from_url(redis_stack)
    try:
        for i in range(20):
            await store.put("ns", f"k{i}", i, delta=0, ttl=0.3)
        await store.put("ns", "live", 1, delta=0, ttl=3600)
        await store.put("ns", "forever", 1, delta=0, ttl=None)
        await store.delete("ns", "forever")
        before = scans(client)
        assert (await store.stats())["ns"]["entries"] == 21
        # Expired keys leave the count on the server's clock, with nothing else running.
        await eventually(lambda: _entries(store, 1), timeout=5)
        assert scans(client) == before  # stats() never scanned the keyspace
    finally:
        client.close()
        await store.close()


async def _entries(store: RedisCacheStore, n: int) -> bool:
    return (await store.stats())["ns"]["entries"] == n


async def test_redis_entries_written_before_the_index_are_counted(redis_stack):
    flush_redis(redis_stack)
    client = redis.Redis.from_url(redis_stack, decode_responses=True)
    old = RedisCacheStore(redis_stack)
    await old.open()
    await old.put("ns", "a", 1, delta=0, ttl=None)
    await old.put("ns", "b", 1, delta=0, ttl=60)
    await old.close()
    client.delete("herd:cache:{ns}:expiry", "herd:cache:{ns}:indexed")  # as an older herd left it
    store = RedisCacheStore(redis_stack)
    await store.open()
    try:
        assert (await store.stats())["ns"]["entries"] == 2
    finally:
        client.close()
        await store.close()


async def test_evaluation_results_expire_after_herd_cache_ttl(pg_url, herd_home):
    settings = Settings.from_env(
        {"HERD_HOME": str(herd_home), "HERD_DATABASE_URL": pg_url, "HERD_CACHE_TTL": "120"}
    )
    async with App(settings=settings) as app:
        rt = await EvalRuntime.of(app)
        await rt.cache.put("key", {"output": 1})
        entry = await rt.cache.store.get("eval", "key")
        assert entry is not None and entry.expires_at == pytest.approx(entry.now + 120, abs=5)
    async with App(settings=settings.override(cache_ttl=0)) as app:  # 0 keeps
        rt = await EvalRuntime.of(app)
        await rt.cache.put("key", {"output": 1})
        entry = await rt.cache.store.get("eval", "key")
        assert entry is not None and entry.expires_at is None


async def test_writes_start_the_purge_in_the_background(pg_store, pg_url):
    await pg_store.put("a", "old", 1, delta=0, ttl=60)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE herd_cache SET keep_until = now() - interval '1 second'")
    store = PostgresCacheStore(pg_url)  # the default: a purge at the first write
    await store.open()
    try:
        await store.put("a", "new", 1, delta=0, ttl=60)
        await eventually(lambda: _only(pg_url, "new"), timeout=10)
    finally:
        await store.close()


async def _only(url: str, key: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT key FROM herd_cache").fetchall() == [(key,)]
