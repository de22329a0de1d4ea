"""Contract: the exact cache (herd.cache.ExactCache) on every store and its locks
(tests/contract/backends.py): singleflight across processes, TTL, XFetch, SWR, namespaces."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from herd.cache import ExactCache, canonical_key
from herd.errors import InvalidInput, Snooze
from tests.helpers import eventually_sync

ROOT = Path(__file__).resolve().parents[2]


def fresh_key() -> str:
    """A key no other test uses, shaped as an evaluation's."""
    return canonical_key(
        model="m1", system="Rate it.", schema=None, params={}, document=uuid.uuid4().hex
    )


def race(kind: str, url: str, k: str, callers: int, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.apps.cache_race", kind, url, k, str(callers), str(seconds)],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.timeout(120)
async def test_hundred_callers_in_ten_processes_make_one_call(cache_backend):
    b = cache_backend
    store = b.store
    k = fresh_key()
    procs = [race(b.kind, b.url, k, 10, 1.0) for _ in range(10)]
    outputs = [await asyncio.to_thread(p.communicate, timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0] * 10, [o[1][-2000:] for o in outputs]
    results = [r for out, _ in outputs for r in json.loads(out)]
    assert len(results) == 100
    assert len(b.calls(k)) == 1
    assert (
        len({json.dumps(v, sort_keys=True) for _, v in results}) == 1
    )  # everyone got the one answer
    sources = [s for s, _ in results]
    assert sources.count("computed") == 1 and set(sources) <= {"computed", "waited", "hit"}
    stats = (await store.stats())["race"]
    assert stats["computed"] == 1 and stats["misses"] >= 1


@pytest.mark.timeout(120)
async def test_holder_killed_mid_call_lets_one_waiter_take_over(cache_backend):
    b = cache_backend
    k = fresh_key()
    holder = race(b.kind, b.url, k, 1, 30.0)  # would compute for 30 s
    eventually_sync(lambda: len(b.calls(k)) == 1, timeout=30)
    waiters = race(b.kind, b.url, k, 5, 0.2)
    await asyncio.sleep(0.3)  # let the waiters find the lock held
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    out, err = await asyncio.to_thread(waiters.communicate, timeout=60)
    assert waiters.returncode == 0, err[-2000:]
    results = json.loads(out)
    assert len(b.calls(k)) == 2  # the killed call and one takeover
    assert [s for s, _ in results].count("computed") == 1
    assert len({json.dumps(v, sort_keys=True) for _, v in results}) == 1


async def test_hit_after_compute_and_errors_are_not_cached(cache_backend):
    store, locks = cache_backend.store, cache_backend.locks
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


async def test_a_lookup_is_counted_in_one_write_with_its_miss(cache_backend, monkeypatch):
    # A computed key's miss went in a write of its own before its computation's: two
    # counter writes per computed key, on every evaluation call.
    store, locks = cache_backend.store, cache_backend.locks
    ns = f"one-{uuid.uuid4().hex[:8]}"
    cache = ExactCache(store, locks, namespace=ns)
    writes: list[dict[str, int]] = []
    count = store.count

    async def counted(amounts: dict[str, int], namespace: str) -> None:
        writes.append({k: v for k, v in amounts.items() if v})
        await count(amounts, namespace)

    monkeypatch.setattr(store, "count", counted)

    async def working():
        return {"score": 7}

    async def failing():
        raise RuntimeError("provider said 500")

    async def handed_back():
        raise Snooze("the batch is parked", after=1.0)

    assert (await cache.get_or_compute("a", working)).source == "computed"
    assert writes == [{"computed": 1, "misses": 1}]
    assert (await cache.get_or_compute("a", working)).source == "hit"
    assert writes[1:] == [{"hits": 1}]
    with pytest.raises(RuntimeError):
        await cache.get_or_compute("b", failing)
    assert writes[2:] == [{"errors": 1, "misses": 1}]
    with pytest.raises(Snooze):
        await cache.get_or_compute("c", handed_back)
    assert writes[3:] == []  # handed back: neither a miss nor an error
    stats = (await store.stats())[ns]
    assert (stats["misses"], stats["computed"], stats["hits"], stats["errors"]) == (2, 1, 1, 1)


@pytest.mark.parametrize("wild", ["a*", "a?", "[ab]", "a\\"])
async def test_clearing_a_namespace_with_glob_characters_leaves_the_others(cache_backend, wild):
    store = cache_backend.store
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


async def test_a_namespace_with_braces_is_refused_on_every_backend(cache_backend):
    store, locks = cache_backend.store, cache_backend.locks
    for bad in ("acme}:k:x", "{acme}", ""):
        with pytest.raises(InvalidInput, match="cache namespace"):
            ExactCache(store, locks, namespace=bad)


async def test_ttl_expiry_recomputes(cache_backend):
    store, locks = cache_backend.store, cache_backend.locks
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


async def test_stale_value_is_served_while_one_caller_refreshes(cache_backend):
    store, locks = cache_backend.store, cache_backend.locks
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


async def test_xfetch_refreshes_early_only_when_enabled(cache_backend):
    store, locks = cache_backend.store, cache_backend.locks
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
