"""bench/pipeline_cost.py compares like with like: the pipeline it hands herd is the
chaos run's, its re-run changes the reduce alone, and DocETL's delimiter split cuts the
manuals where herd's split by heading does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from chaos import pipeline as chaos_pipeline
from herd.llm.eval.pipeline import load
from herd.llm.eval.split import split

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
pipeline_cost = pytest.importorskip("pipeline_cost")


def test_the_manuals_have_their_pieces_and_docetl_cuts_them_where_herd_does() -> None:
    texts = pipeline_cost.manuals(40, (20, 200), seed=5, skew=4.0)
    pipe = chaos_pipeline.pipeline()
    assert pipe.split is not None
    counts = []
    for text in texts.values():
        herd_pieces = [p.text for p in split(text, pipe.split, 100_000, [])]
        docetl_chunks = text.split(pipeline_cost.DELIM)
        assert len(herd_pieces) == len(docetl_chunks)
        assert herd_pieces[0] == docetl_chunks[0].strip()
        counts.append(len(herd_pieces))
    assert min(counts) >= 20 and max(counts) <= 200
    assert max(counts) > 2 * min(counts)  # a spread, not one size


def test_the_rerun_changes_the_reduce_prompt_alone(tmp_path: Path) -> None:
    first = load(pipeline_cost.write_pipeline_toml(tmp_path / "a"))
    again = load(pipeline_cost.write_pipeline_toml(tmp_path / "b", pipeline_cost.RERUN_PROMPT))
    chaos = chaos_pipeline.pipeline()
    by = {s.name: s for s in first.calls}
    by_again = {s.name: s for s in again.calls}
    by_chaos = {s.name: s for s in chaos.calls}
    map_stage, reduce_stage = chaos_pipeline.MAP_STAGE, chaos_pipeline.REDUCE_STAGE
    # The map's spec (model, prompt, schema, params) is the same in both runs: its keys
    # are the first run's, so the re-run finds every map answer in the cache.
    assert first.spec(by[map_stage]) == again.spec(by_again[map_stage])
    assert first.spec(by[reduce_stage]).key("x") != again.spec(by_again[reduce_stage]).key("x")
    # ... and the stages are the chaos run's, whose checker the bench reuses.
    for name in (map_stage, reduce_stage):
        assert by[name].prompt == by_chaos[name].prompt
        assert by[name].schema_ == by_chaos[name].schema_
        assert first.spec(by[name]).model == chaos.spec(by_chaos[name]).model
