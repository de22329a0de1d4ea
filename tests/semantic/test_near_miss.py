"""Near misses against the real default embedder: close in cosine, wrong as an answer."""

from __future__ import annotations

import pytest

from herd.semantic.cache import DEFAULT_THRESHOLD
from tests.semantic.conftest import MakeCache

NEAR_MISSES = [
    ("What does Pasal 5 say about wages?", "What does Pasal 6 say about wages?"),
    ("Which sins are forgiven?", "Which sins are not forgiven?"),
    ("What happened in May 1998?", "What happened in June 1998?"),
    ("What did Moses say to Pharaoh?", "What did Aaron say to Pharaoh?"),
    ("Who are all the kings of Israel?", "Who are some of the kings of Israel?"),
]
REWORDINGS = [
    ("What does Pasal 5 say about wages?", "What does Pasal 5 say about the wages?"),
    ("What is the minimum wage in Jakarta?", "What's the minimum wage in Jakarta?"),
    ("How many days did the flood last?", "How many days did the flood last for?"),
]


@pytest.mark.parametrize(("cached", "asked"), NEAR_MISSES)
async def test_near_misses_miss_only_because_of_the_guards(
    make_cache: MakeCache, embedder, cached, asked
):
    # Threshold 0.8: every pair is above it, so only the guards stand between them.
    guarded = await make_cache(embedder=embedder, threshold=0.8)
    open_ = await make_cache(embedder=embedder, threshold=0.8, guards=False)
    await guarded.astore(cached, "answer")
    assert await guarded.alookup(asked) is None
    hit = await open_.alookup(asked)
    assert hit is not None and hit.query == cached  # what the guards prevented
    stats = await guarded.astats()
    assert stats["guard_rejections"] == 1


@pytest.mark.parametrize(("cached", "asked"), REWORDINGS)
async def test_rewordings_hit_at_the_default_threshold(
    make_cache: MakeCache, embedder, cached, asked
):
    cache = await make_cache(embedder=embedder)
    await cache.astore(cached, "answer")
    hit = await cache.alookup(asked)
    assert hit is not None and hit.value == "answer" and DEFAULT_THRESHOLD <= hit.similarity < 1.0
