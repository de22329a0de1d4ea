"""The exact cache on both backends: keys, singleflight across processes, TTL, XFetch, SWR."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
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
from tests.helpers import eventually_sync

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


@pytest.fixture(params=["postgres", "redis"])
async def backend(request):
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("TRUNCATE herd_cache, herd_cache_stats")
            conn.execute("CREATE TABLE IF NOT EXISTS race_calls (key text, pid int)")
            conn.execute("TRUNCATE race_calls")
        store, locks = PostgresCacheStore(url), PostgresLocks(url, poll_interval=0.1)
    else:
        url = request.getfixturevalue("redis_stack")
        flush_redis(url)
        store, locks = RedisCacheStore(url), RedisLocks(url, poll_interval=0.1)
    await store.open()
    await locks.open()
    yield request.param, url, store, locks
    await locks.close()
    await store.close()


def calls(backend: str, url: str, k: str) -> list[int]:
    if backend == "postgres":
        with psycopg.connect(url) as conn:
            return [r[0] for r in conn.execute("SELECT pid FROM race_calls WHERE key = %s", (k,))]
    client = redis.Redis.from_url(url)
    try:
        return [int(p) for p in client.lrange(f"race_calls:{k}", 0, -1)]
    finally:
        client.close()


def race(name: str, url: str, k: str, callers: int, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.apps.cache_race", name, url, k, str(callers), str(seconds)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.timeout(120)
async def test_hundred_callers_in_ten_processes_make_one_call(backend):
    name, url, store, _ = backend
    k = key(uuid.uuid4().hex)
    procs = [race(name, url, k, 10, 1.0) for _ in range(10)]
    outputs = [await asyncio.to_thread(p.communicate, timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0] * 10, [o[1][-2000:] for o in outputs]
    results = [r for out, _ in outputs for r in json.loads(out)]
    assert len(results) == 100
    assert len(calls(name, url, k)) == 1
    assert (
        len({json.dumps(v, sort_keys=True) for _, v in results}) == 1
    )  # everyone got the one answer
    sources = [s for s, _ in results]
    assert sources.count("computed") == 1 and set(sources) <= {"computed", "waited", "hit"}
    stats = (await store.stats())["race"]
    assert stats["computed"] == 1 and stats["misses"] >= 1


@pytest.mark.timeout(120)
async def test_holder_killed_mid_call_lets_one_waiter_take_over(backend):
    name, url, _, _ = backend
    k = key(uuid.uuid4().hex)
    holder = race(name, url, k, 1, 30.0)  # would compute for 30 s
    eventually_sync(lambda: len(calls(name, url, k)) == 1, timeout=30)
    waiters = race(name, url, k, 5, 0.2)
    await asyncio.sleep(0.3)  # let the waiters find the lock held
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    out, err = await asyncio.to_thread(waiters.communicate, timeout=60)
    assert waiters.returncode == 0, err[-2000:]
    results = json.loads(out)
    assert len(calls(name, url, k)) == 2  # the killed call and one takeover
    assert [s for s, _ in results].count("computed") == 1
    assert len({json.dumps(v, sort_keys=True) for _, v in results}) == 1


async def test_hit_after_compute_and_errors_are_not_cached(backend):
    _, _, store, locks = backend
    cache = ExactCache(store, locks, namespace="t")
    calls_made = []

    async def failing():
        calls_made.append("fail")
        raise RuntimeError("provider said 500")

    async def working():
        calls_made.append("ok")
        return {"score": 7}

    with pytest.raises(RuntimeError):
        await cache.get_or_compute("k", failing)
    first = await cache.get_or_compute("k", working)
    second = await cache.get_or_compute("k", working)
    assert (first.source, second.source) == ("computed", "hit")
    assert second.value == {"score": 7} and calls_made == ["fail", "ok"]
    stats = (await store.stats())["t"]
    assert stats["errors"] == 1 and stats["hits"] == 1 and stats["entries"] == 1


@pytest.mark.parametrize("wild", ["a*", "a?", "[ab]", "a\\"])
async def test_clearing_a_namespace_with_glob_characters_leaves_the_others(backend, wild):
    _, _, store, _ = backend
    others = ["ab", "a", "b", "a\\x", "aa*"]
    for ns in [wild, *others]:
        await store.put(ns, "k1", {"ns": ns}, delta=0.0, ttl=None)
        await store.put(ns, "k2", {"ns": ns}, delta=0.0, ttl=None)
        await store.count({"misses": 2}, ns)
    assert (await store.stats())[wild]["entries"] == 2
    assert await store.clear(wild) == 2
    for ns in others:
        assert await store.get(ns, "k1") is not None, ns
    stats = await store.stats()
    assert stats[wild].get("entries", 0) == 0
    assert {ns: stats[ns]["entries"] for ns in others} == dict.fromkeys(others, 2)


async def test_a_namespace_with_braces_is_refused_on_every_backend(backend):
    _, _, store, locks = backend
    for bad in ("acme}:k:x", "{acme}", ""):
        with pytest.raises(InvalidInput, match="cache namespace"):
            ExactCache(store, locks, namespace=bad)


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


async def test_ttl_expiry_recomputes(backend):
    _, _, store, locks = backend
    cache = ExactCache(store, locks, namespace="ttl", ttl=0.3)
    n = []

    async def compute():
        n.append(1)
        return len(n)

    assert (await cache.get_or_compute("k", compute)).value == 1
    assert (await cache.get_or_compute("k", compute)).source == "hit"
    await asyncio.sleep(0.5)  # time passing is the subject
    again = await cache.get_or_compute("k", compute)
    assert (again.source, again.value) == ("computed", 2)


async def test_stale_value_is_served_while_one_caller_refreshes(backend):
    _, _, store, locks = backend
    cache = ExactCache(store, locks, namespace="swr", ttl=0.3, stale_while_revalidate=30)
    n = []
    gate = asyncio.Event()

    async def compute():
        n.append(1)
        if len(n) > 1:
            await gate.wait()
        return len(n)

    await cache.get_or_compute("k", compute)
    await asyncio.sleep(0.5)
    served = await asyncio.gather(*(cache.get_or_compute("k", compute) for _ in range(20)))
    assert {(s.source, s.value) for s in served} == {("stale", 1)}
    gate.set()
    await cache.drain()
    assert len(n) == 2  # twenty stale reads, one refresh
    fresh = await cache.get_or_compute("k", compute)
    assert (fresh.source, fresh.value) == ("hit", 2)


async def test_xfetch_refreshes_early_only_when_enabled(backend):
    _, _, store, locks = backend
    n = []

    async def compute():
        n.append(1)
        await asyncio.sleep(0.05)  # delta: what XFetch weighs against the time left
        return len(n)

    plain = ExactCache(store, locks, namespace="x1", ttl=60)
    await plain.get_or_compute("k", compute)
    assert (await plain.get_or_compute("k", compute)).source == "hit"
    # beta so large that a 0.05 s computation is always "due" 60 s before expiry
    eager = ExactCache(store, locks, namespace="x2", ttl=60, xfetch_beta=1e6)
    await eager.get_or_compute("k", compute)
    early = await eager.get_or_compute("k", compute)
    assert early.source == "early" and early.value == len(n) == 3


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
