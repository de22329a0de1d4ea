"""Hybrid retrieval end to end: lexemes beside the vectors, the three modes, exact
references, the text-search language, and the cache's scope per mode. Real
PostgreSQL (pgvector, full-text search) and the real default embedder."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from herd import App
from herd.errors import InvalidInput
from herd.rag.corpora import kjv_lines
from herd.rag.fusion import fuse
from herd.rag.ingest import IngestError, RagRuntime, plan_and_apply
from herd.rag.query import answer
from herd.rag.references import patterns
from herd.rag.store import Hit
from tests.rag.support import drain

GOLDEN = Path(__file__).parent / "golden"
GENESIS_1_5 = [line for line in kjv_lines(1) if int(line.split()[1].split(":")[0]) <= 5]


async def indexed(app: App, path: Path, name: str | None = None, **options) -> str:
    name = name or f"c{uuid.uuid4().hex[:10]}"
    await plan_and_apply(app, [path], name, **options)
    await drain(app)
    return name


# One collection for the tests that only read it: after the first, a re-run embeds nothing.
GENESIS = f"genesis-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def genesis(app, tmp_path_factory) -> str:
    kjv = tmp_path_factory.getbasetemp() / "genesis" / "kjv.txt"
    if not kjv.exists():
        kjv.parent.mkdir(exist_ok=True)
        kjv.write_text("\n".join(GENESIS_1_5) + "\n")
    return await indexed(app, kjv, GENESIS)


async def ids(app: App, name: str, text: str, mode: str, k: int = 5, **kw) -> list[str]:
    (a,) = await answer(app, name, [text], k, cache=False, mode=mode, **kw)
    return [h["id"] for h in a.hits]


async def test_lexical_mode_ranks_by_rare_words_and_hybrid_keeps_them(app, genesis):
    rt = await RagRuntime.of(app)
    live = await rt.store.live(genesis)
    assert live.language == "english"  # the verse chunker's default
    # Every chunk has its lexemes, in the generation's table, GIN-indexed.
    rows = await rt.store.fetch(
        "SELECT count(*) FILTER (WHERE lexemes <> ''::tsvector), count(*)"
        f" FROM herd_vectors_{live.id}"
    )
    assert rows[0][0] == rows[0][1] == len(GENESIS_1_5)

    # Names and numbers: only verses holding those words, the one holding most first.
    query = "Mahalaleel eight hundred ninety and five years"
    lexical = await ids(app, genesis, query, "lexical")
    assert lexical[0] == "kjv/genesis/5/17"
    (a,) = await answer(app, genesis, ["Methuselah"], 10, cache=False, mode="lexical")
    assert a.hits and all("Methuselah" in h["text"] for h in a.hits)
    # A rare word outweighs a common one said thrice (inverse document frequency):
    # Genesis 1:27 has "God" three times, no Mahalaleel.
    top = (await answer(app, genesis, ["Mahalaleel God"], 1, cache=False, mode="lexical"))[0]
    assert "Mahalaleel" in top.hits[0]["text"]
    # Stemming (english): "begat" and "begetting" aside, "created" matches "create".
    assert "kjv/genesis/1/1" in await ids(app, genesis, "creating the heavens", "lexical")
    # No word of the corpus: nothing, rather than arbitrary verses.
    assert await ids(app, genesis, "xylophone quantum", "lexical") == []
    assert (await ids(app, genesis, query, "hybrid"))[0] == "kjv/genesis/5/17"
    assert (await ids(app, genesis, query, "hybrid", fusion="weighted"))[0] == "kjv/genesis/5/17"
    # Dense mode is still the embedding's ranking (cosines, not BM25 scores).
    (d,) = await answer(app, genesis, [query], 3, cache=False, mode="dense")
    assert all(-1.0 <= h["score"] <= 1.0 for h in d.hits)


async def test_a_reference_query_returns_its_unit_first_in_every_mode(app, genesis):
    for mode in ("dense", "lexical", "hybrid"):
        assert (await ids(app, genesis, "Genesis 2:7", mode))[0] == "kjv/genesis/2/7"
        assert (await ids(app, genesis, "kjv/genesis/3/9", mode))[0] == "kjv/genesis/3/9"
    # A reference to a unit the collection lacks is an ordinary query.
    assert "kjv/genesis/40/1" not in await ids(app, genesis, "Genesis 40:1", "hybrid")


async def test_pasal_references_and_the_indonesian_language(app):
    name = await indexed(app, GOLDEN / "uu-13-2003.txt")
    rt = await RagRuntime.of(app)
    assert (await rt.store.live(name)).language == "indonesian"  # the pasal chunker's default
    for mode in ("dense", "lexical", "hybrid"):
        found = await ids(app, name, "Pasal 5 ayat (2)", mode)
        assert found[0] == "uu-13-2003/bab-iv/pasal-5/ayat-2"
        assert not any("/penjelasan/" in i for i in found[:1])
    assert (await ids(app, name, "pasal 5A ayat (1)", "dense"))[0] == (
        "uu-13-2003/bab-iv/pasal-5a/ayat-1"
    )
    assert (await ids(app, name, "Penjelasan Pasal 5 ayat (1)", "dense"))[0] == (
        "uu-13-2003/penjelasan/pasal-demi-pasal/pasal-5/ayat-1"
    )
    # Indonesian stemming: "pekerjaan" (work) finds "bekerja"/"pekerja" by their root.
    lexemes = await rt.store.fetch("SELECT to_tsvector('indonesian', 'pekerjaan pekerja')")
    assert lexemes[0][0].count("'") == 2  # one lexeme: the root of both


async def test_the_language_can_be_chosen_and_must_exist(app, tmp_path):
    kjv = tmp_path / "kjv.txt"
    kjv.write_text("\n".join(GENESIS_1_5[:30]) + "\n")
    name = await indexed(app, kjv, language="simple")
    rt = await RagRuntime.of(app)
    live = await rt.store.live(name)
    assert live.language == "simple"
    # simple: no stemming, so "create" no longer matches "created".
    assert "kjv/genesis/1/1" not in await ids(app, name, "create", "lexical")
    assert "kjv/genesis/1/1" in await ids(app, name, "created", "lexical")
    # A re-run without --language keeps the collection's.
    again = await plan_and_apply(app, [kjv], name)
    assert not again.new_generation and again.generation == live.id
    await drain(app)
    with pytest.raises(IngestError, match="--language 'klingon'.*english"):
        await plan_and_apply(app, [kjv], name, language="klingon")


async def test_the_semantic_cache_keeps_each_mode_apart(app, genesis):
    query = "Methuselah lived"
    (dense,) = await answer(app, genesis, [query], 5, mode="dense")
    assert not dense.cached
    (lexical,) = await answer(app, genesis, [query], 5, mode="lexical")
    assert not lexical.cached  # not the dense answer
    assert [h["score"] for h in lexical.hits] != [h["score"] for h in dense.hits]
    (hybrid,) = await answer(app, genesis, [query], 5, mode="hybrid", fusion="rrf")
    (weighted,) = await answer(app, genesis, [query], 5, mode="hybrid", fusion="weighted")
    assert not hybrid.cached and not weighted.cached
    (again,) = await answer(app, genesis, [query], 5, mode="lexical")
    assert again.cached and again.hits == lexical.hits


async def test_bad_modes_and_fusions_are_refused_by_name(app, genesis, monkeypatch):
    with pytest.raises(InvalidInput, match="mode: 'fuzzy' is not one of dense, lexical, hybrid"):
        await answer(app, genesis, ["x"], 3, mode="fuzzy")
    monkeypatch.setenv("HERD_RAG_FUSION", "max")
    with pytest.raises(InvalidInput, match="HERD_RAG_FUSION: 'max' is not one of rrf, weighted"):
        await answer(app, genesis, ["x"], 3, mode="hybrid")
    assert await ids(app, genesis, "light", "dense")  # the setting matters to hybrid only


def hit(chunk_id: str, score: float) -> Hit:
    return Hit(chunk_id, chunk_id, "", score, {})


def test_rrf_counts_ranks_and_weighted_counts_scaled_scores():
    dense = [hit("a", 0.90), hit("b", 0.89), hit("c", 0.10)]
    lexical = [hit("c", 30.0), hit("d", 29.0), hit("a", 1.0)]
    # RRF: a is 1st and 3rd, c 3rd and 1st: a tie broken by id; b and d once each.
    assert [h.chunk_id for h in fuse(dense, lexical, "rrf")] == ["a", "c", "b", "d"]
    # Weighted: b's cosine is near the top of its list, d's BM25 near the top of its
    # list; c is top of one list and bottom of the other, as a is. Lexical weighs 0.6,
    # so c (top of BM25) outranks a (top of cosine), and d outranks b.
    fused = fuse(dense, lexical, "weighted")
    scores = {h.chunk_id: round(h.score, 3) for h in fused}
    assert scores == {"a": 0.4, "b": 0.395, "c": 0.6, "d": 0.579}
    assert [h.chunk_id for h in fused] == ["c", "d", "a", "b"]
    half = fuse(dense, lexical, "weighted", dense_weight=0.5)
    assert {h.chunk_id: round(h.score, 3) for h in half}["a"] == 0.5
    assert fuse([], lexical, "weighted")[0].chunk_id == "c"


def test_reference_patterns():
    assert patterns("John 3:16") == ["%/john/3/16"]
    assert patterns("1 John 4:8.") == ["%/1-john/4/8"]
    assert patterns("Romans 16:25-27") == ["%/romans/16/25-27"]
    assert patterns("kjv/genesis/1/1") == ["kjv/genesis/1/1"]
    assert patterns("Pasal 5 ayat (2) UU 13/2003") == [
        "uu-13-2003/bab-%/pasal-5/ayat-2",
        "uu-13-2003/pasal-5/ayat-2",
    ]
    assert patterns("pasal 52 ayat (1) huruf a")[0] == "%/bab-%/pasal-52/ayat-1/huruf-a"
    assert patterns("Pasal 6")[:2] == ["%/bab-%/pasal-6", "%/pasal-6"]
    for plain in ("what did John say", "light and darkness", "50% of 3/4", "a_b/c"):
        assert patterns(plain) == []
