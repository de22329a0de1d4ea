"""The bounded mode: each entry's threshold learned from verdicts, under an error bound.

Synthetic vectors at known similarities to unit(0), on both backends; the queries'
texts differ only in words the near-miss guards ignore, so the guards agree.
"""

from __future__ import annotations

import numpy as np
import pytest

from herd.config import Settings
from herd.errors import ConfigError
from herd.semantic import SemanticCache, SemanticHit
from tests.semantic.conftest import DIM, MakeCache, unit

Q = "what is the meaning of the passage"
FILLERS = ["please", "tell me", "explain", "describe", "show me", "say", "list", "give"]


def near(similarity: float, axis: int) -> np.ndarray:
    """A vector at ``similarity`` to unit(0), leaning towards unit(axis): queries on
    different axes are far from each other (below the floor of 0.8)."""
    v = np.zeros(DIM, dtype=np.float64)
    v[0], v[axis] = similarity, np.sqrt(1 - similarity**2)
    return v.astype(np.float32)


def asked(i: int) -> str:
    return f"{FILLERS[i]} {Q}"


async def trust_similarity(cache: SemanticCache, similarity: float, n: int) -> None:
    """Right verdicts on an unrelated entry: the pool's evidence that serving at this
    similarity is safe."""
    other = await cache.astore("an unrelated question", "x", vector=unit(DIM - 1))
    hit = SemanticHit("x", similarity, "an unrelated question", "hit", 0.0, None, other, True)
    for _ in range(n):
        await cache.areport(hit, correct=True)


async def test_an_entry_that_served_a_wrong_hit_stops_serving_that_neighbour(
    make_cache: MakeCache,
):
    cache = await make_cache(mode="bounded", error_bound=0.05, recheck=0.0)
    await cache.astore(Q, "A", vector=unit(0))
    await cache.astore("what is the gist of the text", "B", vector=unit(3))
    await trust_similarity(cache, 0.9, 40)

    hit = await cache.alookup(asked(0), vector=near(0.9, 1))
    assert hit is not None and hit.value == "A" and hit.entry is not None
    await cache.areport(hit, correct=False)

    assert await cache.alookup(asked(0), vector=near(0.9, 1)) is None
    assert await cache.alookup(asked(1), vector=near(0.88, 2)) is None  # farther: refused too
    # The threshold is the entry's own: another entry at the same similarity still serves.
    other = np.zeros(DIM, dtype=np.float32)
    other[3], other[4] = 0.9, np.sqrt(1 - 0.81)
    found = await cache.alookup("what is the gist of this text", vector=other)
    assert found is not None and found.value == "B"

    # Stored with the entry and the pool: a fresh cache on the same backend agrees.
    await cache.flush()
    again = await make_cache(mode="bounded", error_bound=0.05, recheck=0.0)
    assert await again.alookup(asked(0), vector=near(0.9, 1)) is None
    found = await again.alookup("what is the gist of this text", vector=other)
    assert found is not None and found.value == "B"
    stats = await again.astats()
    assert stats["verdicts_wrong"] == 1 and stats["verdicts_right"] == 40


async def test_right_verdicts_lower_an_entrys_threshold_within_the_bound(
    make_cache: MakeCache,
):
    loose = await make_cache(name="loose", mode="bounded", error_bound=0.25, recheck=0.0)
    strict = await make_cache(name="strict", mode="bounded", error_bound=0.05, recheck=0.0)

    async def answer() -> str:
        return "A"  # the entry's answer: each miss is a right verdict on it

    for cache in (loose, strict):
        await cache.astore(Q, "A", vector=unit(0))
        # Nothing learned yet: a neighbour at 0.85 is computed, and judged right.
        found = await cache.aget_or_compute(asked(0), answer, vector=near(0.85, 1))
        assert found.source == "computed"
        found = await cache.aget_or_compute(asked(1), answer, vector=near(0.85, 2))
        if cache is loose:  # that verdict brings the chance of a wrong hit under 1/4
            assert found.source == "hit" and found.query == Q
        else:  # not under 1/20
            assert found.source == "computed"

    # The entry's own verdict did it: another entry at 0.85, with only the pool's
    # evidence, is not served.
    await loose.astore("what is the gist of the text", "B", vector=unit(4))
    other = np.zeros(DIM, dtype=np.float32)
    other[4], other[5] = 0.85, np.sqrt(1 - 0.85**2)
    found = await loose.aget_or_compute("what is the gist of this text", answer, vector=other)
    assert found.source == "computed"


async def test_a_miss_judges_its_nearest_candidate_and_a_wrong_one_stays_refused(
    make_cache: MakeCache,
):
    # Floor 0.85: the queries, 0.81 from each other, are no candidates for one another.
    cache = await make_cache(mode="bounded", error_bound=0.25, recheck=0.0, threshold=0.85)
    await cache.astore(Q, "A", vector=unit(0))

    async def other_answer() -> str:
        return "not A"

    for i in range(3):
        found = await cache.aget_or_compute(asked(i), other_answer, vector=near(0.9, i + 1))
        assert found.source == "computed" and found.value == "not A"
    stats = await cache.astats()
    assert stats["verdicts_wrong"] == 3 and stats["hits"] == 0


async def test_recheck_computes_a_served_hit_and_judges_it(make_cache: MakeCache):
    cache = await make_cache(mode="bounded", error_bound=0.05, recheck=1.0)
    await cache.astore(Q, "A", vector=unit(0))
    await trust_similarity(cache, 0.9, 40)

    async def fresh() -> str:
        return "A2"

    found = await cache.aget_or_compute(asked(0), fresh, vector=near(0.9, 1))
    assert found.source == "computed" and found.value == "A2"
    stats = await cache.astats()
    assert stats["rechecks"] == 1 and stats["verdicts_wrong"] == 1


async def test_a_lookup_serves_what_is_within_the_bound_without_rechecks(
    make_cache: MakeCache,
):
    # alookup computes nothing, so it has nothing to recheck against: it serves.
    cache = await make_cache(mode="bounded", error_bound=0.05, recheck=1.0)
    await cache.astore(Q, "A", vector=unit(0))
    await trust_similarity(cache, 0.9, 40)
    hit = await cache.alookup(asked(0), vector=near(0.9, 1))
    assert hit is not None and hit.value == "A"
    assert (await cache.astats())["rechecks"] == 0


async def test_an_exact_repeat_is_served_before_anything_is_learned(make_cache: MakeCache):
    cache = await make_cache(mode="bounded", recheck=0.0)
    calls = 0

    async def compute() -> str:
        nonlocal calls
        calls += 1
        return "A"

    for _ in range(2):
        await cache.aget_or_compute(Q, compute, vector=unit(0))
    assert calls == 1


async def test_report_needs_a_cached_hit(make_cache: MakeCache):
    cache = await make_cache(mode="bounded")
    computed = SemanticHit("A", 1.0, Q, "computed", 0.0, None)
    with pytest.raises(ConfigError, match="served from the cache"):
        await cache.areport(computed, correct=True)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"mode": "strict"}, "mode"),
        ({"mode": "bounded", "error_bound": 0.0}, "error_bound"),
        ({"mode": "bounded", "error_bound": 1.5}, "error_bound"),
        ({"mode": "bounded", "recheck": -0.1}, "recheck"),
    ],
)
def test_bad_settings_are_refused_by_name(kw, field):
    with pytest.raises(ConfigError, match=field):
        SemanticCache("redis://localhost:1", embedder_id="e", dim=4, **kw)


def test_the_settings_choose_the_mode_and_bound():
    s = Settings.from_env({"HERD_SEMANTIC_MODE": "bounded", "HERD_SEMANTIC_ERROR_BOUND": "0.02"})
    assert (s.semantic_mode, s.semantic_error_bound) == ("bounded", 0.02)
    assert Settings.from_env({}).semantic_mode == "guarded"
    for bad in ("0", "1", "abc", "nan"):
        with pytest.raises(ConfigError, match="HERD_SEMANTIC_ERROR_BOUND"):
            Settings.from_env({"HERD_SEMANTIC_ERROR_BOUND": bad})
    with pytest.raises(ConfigError, match="HERD_SEMANTIC_MODE"):
        Settings.from_env({"HERD_SEMANTIC_MODE": "vcache"})


def test_a_retrieval_is_judged_by_its_first_chunk():
    from herd.semantic.runtime import same_top_hit

    def found(*ids: int, score: float = 0.9) -> dict:
        return {"k": 10, "hits": [{"id": i, "score": score} for i in ids]}

    assert same_top_hit(found(1, 2, 3), found(1, 3, 2, score=0.8))
    assert not same_top_hit(found(1, 2), found(2, 1))
    assert same_top_hit(found(), found())  # equal values agree, chunks or not
    assert not same_top_hit({"other": 1}, {"other": 2})


async def test_the_store_keeps_an_entrys_newest_verdicts_and_forgets_them_with_its_value(
    make_cache: MakeCache,
):
    from herd.semantic.bounded import KEPT

    cache = await make_cache(mode="bounded")
    entry = await cache.astore(Q, "A", vector=unit(0))
    store = cache.backend
    for i in range(KEPT + 3):
        await store.judge(cache.name, entry, 0.8 + i / 100, i % 2 == 0, keep=KEPT)
    await store.judge(cache.name, "no-such-entry", 0.9, True, keep=KEPT)  # stays gone

    async def verdicts() -> list[tuple[float, bool]]:
        _, found = await store.search(
            cache.name, _scope(cache), unit(0), k=5, alive_at=cache.now(), floor=0.0
        )
        return [c.verdicts for c in found if c.id == entry][0]

    kept = await verdicts()
    assert len(kept) == KEPT
    assert kept[-1] == (pytest.approx(0.8 + (KEPT + 2) / 100), True)  # newest last
    assert kept[0] == (pytest.approx(0.8 + 3 / 100), False)
    await cache.astore(Q, "A, recomputed", vector=unit(0))
    assert await verdicts() == []
    _, found = await store.search(
        cache.name, _scope(cache), unit(0), k=5, alive_at=cache.now(), floor=0.0
    )
    assert len(found) == 1  # the verdict on a missing entry made none


def _scope(cache: SemanticCache):
    from herd.semantic.base import Scope

    assert cache.embedder_id is not None
    return Scope(cache.tenant, cache.embedder_id)
