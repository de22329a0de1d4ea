"""The semantic cache on both backends: thresholds, scope, TTL, bound, sync and async."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import redis

from herd.cache import exact
from herd.errors import ConfigError, InvalidInput
from herd.semantic import SemanticCache, similarity
from herd.semantic.cache import DEFAULT_THRESHOLD
from herd.semantic.postgres import PostgresSemanticStore
from herd.semantic.redis import NAMES, RedisSemanticStore
from herd.semantic.stores import store_for_url
from tests.conftest import ROOT, flush_redis
from tests.helpers import eventually
from tests.semantic.conftest import DIM, MakeCache, at_angle, random_vectors, unit

Q = "what is the meaning of the passage"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("bad", [-0.01, 1.0000001, math.nan, math.inf, "0.9", True])
def test_threshold_outside_0_1_is_refused(bad):
    with pytest.raises(ConfigError):
        SemanticCache("redis://localhost:1", embedder_id="e", dim=4, threshold=bad)


async def test_threshold_boundary_exactly_at_just_under_just_over(make_cache: MakeCache):
    cache = await make_cache()
    stored = at_angle(DEFAULT_THRESHOLD)
    await cache.astore(Q, "answer", vector=stored)
    # float64 of the vectors as the store keeps them (float16 on Redis), as the cache scores
    exact = similarity(unit(0), cache.backend.quantize(stored))
    assert abs(exact - DEFAULT_THRESHOLD) < 1e-3
    hit = await cache.alookup(Q, vector=unit(0), threshold=exact)
    assert hit is not None and hit.similarity == exact and hit.value == "answer"
    assert await cache.alookup(Q, vector=unit(0), threshold=exact - 1e-9) is not None
    assert await cache.alookup(Q, vector=unit(0), threshold=exact + 1e-9) is None
    # The stored vector sits a hair off the default threshold, which says which side.
    assert (await cache.alookup(Q, vector=unit(0)) is None) == (exact < DEFAULT_THRESHOLD)
    assert await cache.alookup(Q, vector=unit(0), threshold=np.nextafter(exact, 2)) is None


async def test_threshold_one_needs_the_same_vector_and_zero_takes_anything_not_opposed(
    make_cache: MakeCache,
):
    cache = await make_cache()
    v = random_vectors(1)[0]
    await cache.astore(Q, "same", vector=v)
    hit = await cache.alookup(Q, vector=v, threshold=1.0)
    assert hit is not None and hit.similarity == 1.0
    nudged = v.copy()
    nudged[0] += 1e-3
    assert await cache.alookup(Q, vector=nudged, threshold=1.0) is None
    other = await make_cache(name="zero", threshold=0.0)
    await other.astore(Q, "x", vector=unit(0))
    orthogonal = await other.alookup(Q, vector=unit(1))
    assert orthogonal is not None and orthogonal.similarity == 0.0
    assert await other.alookup(Q, vector=-unit(0)) is None  # cosine -1 is below 0


async def test_no_hit_across_tenants(make_cache: MakeCache):
    cache = await make_cache()
    v = random_vectors(1)[0]
    await cache.astore(Q, "acme's", vector=v, tenant="acme")
    assert await cache.alookup(Q, vector=v, tenant="globex") is None
    assert await cache.alookup(Q, vector=v) is None  # the default tenant
    hit = await cache.alookup(Q, vector=v, tenant="acme")
    assert hit is not None and hit.value == "acme's"


async def test_filter_is_inside_the_knn_query(make_cache: MakeCache):
    """Many closer entries of another tenant must not crowd out this tenant's one."""
    cache = await make_cache(threshold=0.5, k=2)
    for i, v in enumerate(random_vectors(30, seed=3)):
        near = (unit(0) + 0.01 * v).astype(np.float32)
        await cache.astore(f"{Q} {i}", i, vector=near, tenant="noisy")
    await cache.astore(Q, "mine", vector=at_angle(0.9), tenant="quiet")
    hit = await cache.alookup(Q, vector=unit(0), tenant="quiet")
    assert hit is not None and hit.value == "mine"


async def test_another_embedder_never_matches(make_cache: MakeCache):
    first = await make_cache(embedder_id="model-a")
    second = await make_cache(embedder_id="model-b")
    v = random_vectors(1)[0]
    await first.astore(Q, "a", vector=v)
    assert await second.alookup(Q, vector=v) is None
    assert (await first.alookup(Q, vector=v)) is not None


async def test_a_generation_swap_invalidates(make_cache: MakeCache):
    cache = await make_cache()
    v = random_vectors(1)[0]
    await cache.astore(Q, "old context", vector=v, collection="kjv", generation=1)
    assert await cache.alookup(Q, vector=v, collection="kjv", generation=2) is None
    assert await cache.alookup(Q, vector=v, collection="asv", generation=1) is None
    assert await cache.alookup(Q, vector=v, collection="kjv", generation=1) is not None


async def test_absolute_ttl_expires(make_cache: MakeCache):
    clock = Clock()
    cache = await make_cache(ttl=60, clock=clock)
    v = random_vectors(1)[0]
    await cache.astore(Q, "x", vector=v)
    clock.now += 59.9
    assert await cache.alookup(Q, vector=v) is not None
    clock.now += 0.2  # hits do not renew an absolute ttl
    assert await cache.alookup(Q, vector=v) is None


async def test_sliding_ttl_renews_on_hit(make_cache: MakeCache):
    clock = Clock()
    cache = await make_cache(ttl=60, sliding=True, clock=clock)
    v = random_vectors(1)[0]
    await cache.astore(Q, "x", vector=v)
    for _ in range(3):
        clock.now += 50
        assert await cache.alookup(Q, vector=v) is not None
    clock.now += 61
    assert await cache.alookup(Q, vector=v) is None


async def test_ttl_on_the_servers_clock(make_cache: MakeCache):
    cache = await make_cache(ttl=0.3)
    v = random_vectors(1)[0]
    await cache.astore(Q, "x", vector=v)

    async def gone() -> bool:
        return await cache.alookup(Q, vector=v) is None

    await eventually(gone, timeout=5)


async def test_eviction_keeps_the_bound_and_spares_the_recently_used(make_cache: MakeCache):
    cache = await make_cache(max_entries=5, threshold=0.999)
    vectors = random_vectors(12, seed=11)
    for i in range(5):
        await cache.astore(f"question {i}", i, vector=vectors[i])
    assert await cache.alookup("question 0", vector=vectors[0]) is not None
    await cache.flush()  # last use reaches the backend
    for i in range(5, 12):
        await cache.astore(f"question {i}", i, vector=vectors[i])
        assert (await cache.astats())["entries"] <= 5
    stats = await cache.astats()
    assert stats["entries"] == 5 and stats["evictions"] >= 7
    assert await cache.alookup("question 11", vector=vectors[11]) is not None
    assert await cache.alookup("question 1", vector=vectors[1]) is None


async def test_two_hundred_identical_misses_compute_once(make_cache: MakeCache):
    cache = await make_cache(name="stampede")
    v = random_vectors(1)[0]
    calls = 0

    async def retrieve() -> list[str]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.3)  # the retrieval's own duration, not synchronisation
        return ["kjv/genesis/1/1"]

    searches = 0
    search = cache.backend.search

    async def counted(*args: Any, **kw: Any) -> Any:
        nonlocal searches
        searches += 1
        return await search(*args, **kw)

    cache.backend.search = counted  # type: ignore[method-assign]
    results = await asyncio.gather(
        *(cache.aget_or_compute(Q, retrieve, vector=v) for _ in range(200))
    )
    assert calls == 1
    # Identical searches in flight are shared: fewer searches than callers (each caller
    # looks at least twice, and 646 searches were made before they were shared).
    assert searches < 200, searches
    assert all(r.value == ["kjv/genesis/1/1"] for r in results)
    sources = [r.source for r in results]
    assert sources.count("computed") == 1
    stats = await cache.astats()
    assert stats["computed"] == 1 and stats["stampedes_suppressed"] >= 1


async def test_a_stale_value_is_served_while_one_caller_refreshes(make_cache: MakeCache):
    clock = Clock()
    cache = await make_cache(ttl=10, stale_while_revalidate=100, xfetch_beta=None, clock=clock)
    v = random_vectors(1)[0]
    await cache.astore(Q, "old", vector=v)
    clock.now += 20
    assert await cache.alookup(Q, vector=v) is None  # expired for plain lookups
    calls = 0
    release = asyncio.Event()

    async def refresh() -> str:
        nonlocal calls
        calls += 1
        await release.wait()
        return "new"

    first = await asyncio.gather(*(cache.aget_or_compute(Q, refresh, vector=v) for _ in range(5)))
    assert [r.value for r in first] == ["old"] * 5
    assert {r.source for r in first} == {"stale"}
    release.set()
    await cache.adrain()
    assert calls == 1
    hit = await cache.alookup(Q, vector=v)
    assert hit is not None and hit.value == "new"


async def test_xfetch_refreshes_early_near_expiry(make_cache: MakeCache, monkeypatch):
    # XFetch draws U: with U = 0.5 the early gap is 1000 x ln 2 = 693 s, past the 5 s left.
    # (Drawn freely, 1 run in 200 got U > e^-0.005 and no early refresh: seen in CI.)
    monkeypatch.setattr(exact.random, "random", lambda: 0.5)
    clock = Clock()
    cache = await make_cache(ttl=10, xfetch_beta=1.0, clock=clock)
    v = random_vectors(1)[0]
    await cache.astore(Q, "old", vector=v, delta=1000.0)  # an expensive value: refresh early

    async def compute() -> str:
        return "fresh"

    clock.now += 5
    found = await cache.aget_or_compute(Q, compute, vector=v)
    assert found.source == "early" and found.value == "fresh"


async def test_errors_are_not_cached(make_cache: MakeCache):
    cache = await make_cache()
    v = random_vectors(1)[0]

    async def fail() -> str:
        raise RuntimeError("retriever down")

    with pytest.raises(RuntimeError):
        await cache.aget_or_compute(Q, fail, vector=v)
    assert await cache.alookup(Q, vector=v) is None


async def test_an_answer_past_max_entry_bytes_is_returned_not_stored(make_cache: MakeCache):
    # The bound of entries alone let 100 queries of k=1000 add 7 MB to a cache.
    cache = await make_cache(max_entry_bytes=100, threshold=0.999)
    v = random_vectors(3, seed=9)
    large = {"hits": ["x" * 100]}

    async def compute():
        return large

    found = await cache.aget_or_compute(Q, compute, vector=v[0])
    assert found.value == large and found.source == "computed"
    await cache.astore("another question", large, vector=v[1])
    await cache.astore("a small one", {"hits": ["x"]}, vector=v[2])
    assert await cache.alookup(Q, vector=v[0]) is None
    assert await cache.alookup("another question", vector=v[1]) is None
    assert await cache.alookup("a small one", vector=v[2]) is not None
    stats = await cache.astats()
    assert (stats["too_large"], stats["stores"], stats["entries"]) == (2, 1, 1)


def test_max_entry_bytes_is_a_positive_integer_or_none(backend_url):
    for bad in (0, -1, 1.5, "100"):
        with pytest.raises(ConfigError, match="max_entry_bytes must be a positive integer"):
            SemanticCache(backend_url[1], max_entry_bytes=bad, embedder_id="e", dim=DIM)


async def test_stats_count_hits_misses_and_similarity(make_cache: MakeCache):
    cache = await make_cache(name="figures")
    v = random_vectors(2, seed=5)
    await cache.astore(Q, 1, vector=v[0])
    assert await cache.alookup(Q, vector=v[0]) is not None
    assert await cache.alookup("another one", vector=v[1]) is None
    stats = await cache.astats()
    assert stats["hits"] == 1 and stats["misses"] == 1 and stats["entries"] == 1
    assert stats["hit_rate"] == 0.5
    sims = stats["nearest_similarity"]
    assert sims["count"] == 2 and sims["buckets"]["1"] == 2
    assert stats["lookup_seconds"]["count"] == 2


async def test_clear_by_collection(make_cache: MakeCache):
    cache = await make_cache()
    v = random_vectors(2)
    await cache.astore(Q, 1, vector=v[0], collection="kjv")
    await cache.astore(Q, 2, vector=v[1], collection="uu")
    assert await cache.aclear(collection="kjv") == 1
    assert await cache.alookup(Q, vector=v[0], collection="kjv") is None
    assert await cache.alookup(Q, vector=v[1], collection="uu") is not None


@pytest.mark.parametrize("wild", ["a*", "a?", "[ab]", "a\\"])
async def test_clearing_a_cache_with_glob_characters_leaves_the_others(
    make_cache: MakeCache, wild: str
):
    v = random_vectors(2, seed=3)
    cleared = await make_cache(name=wild)
    others = [await make_cache(name=n) for n in ("ab", "a", "a\\x")]
    await cleared.astore(Q, 1, vector=v[0])
    for other in others:
        await other.astore(Q, 2, vector=v[1])
    assert await cleared.aclear() == 1
    assert await cleared.alookup(Q, vector=v[0]) is None
    for other in others:
        assert await other.alookup(Q, vector=v[1]) is not None, other.name
        assert (await other.astats())["entries"] == 1


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("acme}:8:e:x", r"semantic cache name 'acme}:8:e:x' may not contain braces"),
        ("{acme}", "may not contain braces"),
        ("", "semantic cache name must not be empty"),
        ("x" * 192, "name is 192 characters long; the limit is 191"),
    ],
)
def test_a_cache_name_that_is_no_hash_tag_is_refused_on_every_backend(
    backend_url: tuple[str, str], name: str, message: str
):
    # On Redis the keys of "acme}:8:e:x" began with cache "acme"'s, which read and
    # cleared them; refused on PostgreSQL too, so that a name means the same on both.
    with pytest.raises(InvalidInput, match=message):
        SemanticCache(backend_url[1], name=name, embedder_id="synthetic-v1", dim=DIM)


async def test_the_redis_store_refuses_braces_and_skips_names_stored_before(redis_stack):
    flush_redis(redis_stack)
    store = RedisSemanticStore(redis_stack)
    await store.open(DIM)
    try:
        with pytest.raises(InvalidInput, match="semantic cache name 'acme}' may not contain"):
            await store.clear("acme}")
        with pytest.raises(InvalidInput, match="may not contain braces"):
            await store.add_stats("acme}:8:e:x", {"hits": 1})
        # A name stored before names were checked breaks neither the figures nor a clear.
        with redis.Redis.from_url(redis_stack) as r:
            r.sadd(NAMES, "old}:8:e:x", "fine")
        assert set(await store.read_stats()) == {"fine"}
        assert await store.clear(None) == 0
    finally:
        await store.close()


def test_sync_and_async_agree(backend_url):
    url = backend_url[1]
    vectors = random_vectors(6, seed=21)
    probes = [(vectors[i] + 0.05 * vectors[(i + 1) % 6]).astype(np.float32) for i in range(6)]
    thresholds = [0.0, 0.9, 0.95, 0.99, 1.0]
    with SemanticCache(url, embedder_id="sync", dim=DIM, name="sync") as cache:
        for i in range(3):
            cache.store(f"q {i}", i, vector=vectors[i])
        sync = [
            (h.value, h.similarity) if (h := cache.lookup("q 0", vector=p, threshold=t)) else None
            for p in probes
            for t in thresholds
        ]
        computed = cache.get_or_compute("q 9", lambda: "made", vector=vectors[5])
        assert (computed.value, computed.source) == ("made", "computed")
        again = cache.get_or_compute("q 9", lambda: "not again", vector=vectors[5])
        assert (again.value, again.source, again.similarity) == ("made", "hit", 1.0)

    async def run() -> list:
        async with SemanticCache(url, embedder_id="sync", dim=DIM, name="sync") as cache:
            return [
                (h.value, h.similarity)
                if (h := await cache.alookup("q 0", vector=p, threshold=t))
                else None
                for p in probes
                for t in thresholds
            ]

    assert asyncio.run(run()) == sync
    assert any(r is None for r in sync) and any(r is not None for r in sync)


def test_exported_from_herd():
    import herd

    assert "SemanticCache" in herd.__all__ and herd.SemanticCache is SemanticCache


def test_a_cache_used_without_opening_opens_itself(backend_url, embedder):
    # docs/usage.md's semantic cache example: no `with`, the real embedder, sync calls.
    cache = SemanticCache(backend_url[1], embedder=embedder, name="readme")
    try:
        cache.store("Which sins are forgiven?", {"hits": ["kjv/matthew/12/31"]}, collection="kjv")
        hit = cache.lookup("Which sins will be forgiven?", collection="kjv")
        assert hit is not None and hit.value == {"hits": ["kjv/matthew/12/31"]}
        assert hit.similarity >= DEFAULT_THRESHOLD
        assert cache.lookup("Which sins are not forgiven?", collection="kjv") is None
    finally:
        cache.__exit__(None, None, None)


README_SCRIPT = """
import sys
from herd import SemanticCache
from herd.rag.embedders import minilm_embedder

cache = SemanticCache(sys.argv[1], embedder=minilm_embedder(), name="script", ttl=3600)
cache.store("Which sins are forgiven?", {"hits": ["kjv/matthew/12/31"]}, collection="kjv")
hit = cache.lookup("Which sins will be forgiven?", collection="kjv")
miss = cache.lookup("Which sins are not forgiven?", collection="kjv")
print(hit is not None, miss is None)
"""


def test_the_readme_example_run_as_a_script_closes_itself_at_exit(
    backend_url, embedder, herd_home, tmp_path
):
    # No `with` and no close: the interpreter's exit closes the cache, quietly, and the
    # figures it buffered (flushed once a second) reach the backend instead of being lost.
    script = tmp_path / "readme_example.py"
    script.write_text(README_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
    r = subprocess.run(
        [sys.executable, str(script), backend_url[1]],
        env={**env, "HERD_HOME": str(herd_home), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]
    assert r.stderr == "", r.stderr  # no "Task was destroyed but it is pending!"
    cache = SemanticCache(backend_url[1], embedder=embedder, name="script")
    try:
        stats = cache.stats()
    finally:
        cache.__exit__(None, None, None)
    assert stats["hits"] == 1 and stats["misses"] == 1


def test_the_url_s_scheme_chooses_the_store_and_an_unknown_one_is_refused():
    assert isinstance(store_for_url("redis://127.0.0.1:9/0"), RedisSemanticStore)
    assert isinstance(store_for_url("rediss://127.0.0.1:9/0"), RedisSemanticStore)
    assert isinstance(store_for_url("postgresql://u@127.0.0.1:9/db"), PostgresSemanticStore)
    assert isinstance(store_for_url("host=127.0.0.1 port=9 dbname=db"), PostgresSemanticStore)
    with pytest.raises(ConfigError, match=r"redis:// or postgresql://, not 'mysql://h/db'"):
        store_for_url("mysql://h/db")


async def test_redis_keeps_float16_vectors_once_and_a_query_still_meets_its_own_entry(
    make_cache: MakeCache, backend_url: tuple[str, str]
):
    if backend_url[0] != "redis":
        pytest.skip("float16 storage is the Redis store's; pgvector keeps float32")
    cache = await make_cache(name="half")
    v = random_vectors(1)[0]
    await cache.astore(Q, "x", vector=v)
    with redis.Redis.from_url(backend_url[1]) as r:
        keys = list(r.scan_iter(match="herd:semantic:*half*:e:*"))
        assert len(keys) == 1
        assert len(r.hget(keys[0], "vec")) == DIM * 2  # two bytes a dimension
        assert not {b"id", b"scope"} & set(r.hkeys(keys[0]))  # the key and tags say it
    hit = await cache.alookup(Q, vector=v, threshold=1.0)
    assert hit is not None and hit.similarity == 1.0 and hit.value == "x"
    assert cache.backend.quantize(v).tolist() != v.tolist()  # it was rounded, and matched
