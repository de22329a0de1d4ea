"""The exact cache: its keys, and what each store does of its own. The suite every
store passes is tests/contract/test_cache_store.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from herd.cache import (
    ExactCache,
    PostgresCacheStore,
    RedisCacheStore,
    canonical_key,
    normalize_document,
)
from herd.cache.redis import NAMESPACES
from herd.errors import InvalidInput
from herd.locks import PostgresLocks, RedisLocks
from herd.testing.servers.redis_stack import RedisStackServer
from tests.conftest import CACHE, flush_redis

ROOT = Path(__file__).resolve().parent.parent.parent
SCHEMA = {"type": "object", "properties": {"score": {"type": "integer"}}}


def key(document: str = "A paper.\n", **over: object) -> str:
    parts = {"model": "m1", "system": "Rate it.", "schema": SCHEMA, "params": {"t": 0},
             "document": document}  # fmt: skip
    parts.update(over)
    return canonical_key(**parts)  # type: ignore[arg-type]


def test_whitespace_only_revisions_share_a_key_and_real_changes_do_not():
    base = key("Title\n\nBody text.\n")
    assert key("Title  \r\n\r\nBody text.   \r\n\r\n") == base
    assert key("\n\nTitle\n\n\n\nBody text.\n") == base  # extra blank lines
    assert key("\ufeffTitle\n\nBody text.") != base  # a BOM is content, not layout
    assert key("Title\n\nBody text!") != base
    assert key(model="m2") != base
    assert key(system="Rate it harshly.") != base
    assert key(schema={"type": "object"}) != base
    assert key(params={"t": 1}) != base
    assert normalize_document("e\u0301") == "\u00e9"  # NFC


async def test_on_redis_no_namespace_reaches_into_another_s_keys(redis_stack):
    # The keys of namespace "acme}:k:x" began with those of "acme": "acme" read its entry
    # under the key "x}:k:k", and clearing "acme" removed it.
    flush_redis(redis_stack)
    store = RedisCacheStore(redis_stack)
    await store.open()
    try:
        with pytest.raises(InvalidInput, match="cache namespace 'acme}:k:x' may not contain"):
            await store.put("acme}:k:x", "k", {"tenant": "B"}, delta=0.0, ttl=None)
        for call in (
            store.get("acme}:k:x", "k"),
            store.delete("a{b}", "k"),
            store.clear("acme}"),
            store.count({"hits": 1}, "acme}"),
        ):
            with pytest.raises(InvalidInput, match="may not contain braces"):
                await call
        assert await store.get("acme", "x}:k:k") is None
        # A name stored before names were checked breaks neither the figures nor a clear.
        with redis.Redis.from_url(redis_stack) as r:
            r.sadd(NAMESPACES, "old}:k:x")
        await store.put("fine", "k", 1, delta=0.0, ttl=None)
        assert set(await store.stats()) == {"fine"}
        assert await store.clear() == 1
    finally:
        await store.close()


async def test_redis_cache_survives_a_restart_with_aof(tmp_path):
    server = RedisStackServer(CACHE / "cache", tmp_path / "r", appendonly=True,
                              appendfsync="always")  # fmt: skip
    server.start()
    try:
        for attempt in range(2):
            store, locks = RedisCacheStore(server.url), RedisLocks(server.url)
            await store.open()
            cache = ExactCache(store, locks, namespace="durable")

            async def compute():
                return {"computed_in_round": attempt}

            got = await cache.get_or_compute("k", compute)
            await store.close()
            await locks.close()
            if attempt == 0:
                server.kill()
                server.start()
        assert (got.source, got.value) == ("hit", {"computed_in_round": 0})
    finally:
        server.stop()


@pytest.mark.timeout(120)
async def test_postgres_cache_survives_a_server_restart(tmp_path_factory):
    from herd.embedded import EmbeddedPostgres

    home = tmp_path_factory.mktemp("pgc")
    server = EmbeddedPostgres(home)
    try:
        for attempt in range(2):
            url = server.acquire()
            store, locks = PostgresCacheStore(url), PostgresLocks(url)
            await store.open()
            await locks.open()
            cache = ExactCache(store, locks, namespace="durable")

            async def compute():
                return {"computed_in_round": attempt}

            got = await cache.get_or_compute("k", compute)
            await locks.close()
            await store.close()
            server.release()  # the last holder: the server stops
            assert not server.is_running()
        assert (got.source, got.value) == ("hit", {"computed_in_round": 0})
    finally:
        server.release()
