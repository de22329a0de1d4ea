"""A reduce larger than its model's context, reduced in rounds: batches of the map's
answers that fit, then the batches' answers, until one call reads them all; every round
cached by what it reads, one final answer per document."""

from __future__ import annotations

import json

from herd.jsonvalue import canonical
from herd.limits.tokens import count_text
from herd.llm.eval import results
from herd.llm.eval.pipeline import from_json
from herd.llm.eval.pipesubmit import submit_pipeline_texts
from herd.llm.eval.rounds import group, room
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.stageview import stage_progress, stage_rows
from herd.llm.eval.status import BatchStatus, batch_status
from herd.llm.follow import print_stages, summary
from tests.llm.test_pipeline import NOTE, SUMMARY, app, drain, manual  # noqa: F401

# 256 tokens of context for the reduce's model: a quarter kept for the answer, the rest
# holds a handful of the map's notes, far fewer than a document's 24 sections.
SMALL = 256


def pipeline(context: int = SMALL) -> dict:
    return {
        "defaults": {"model": "sim-1"},
        "context": {"sim-reduce": context},
        "stages": [
            {"name": "sections", "kind": "split", "by": "headings", "depth": 2},
            {"name": "notes", "kind": "map", "prompt": "Note it.", "schema": NOTE},
            {"name": "summary", "kind": "reduce", "prompt": "Sum up.", "schema": SUMMARY,
             "model": "sim-reduce"},
        ],
    }  # fmt: skip


TEXTS = {f"m{d}.md": manual(f"Device {d}", 23 + d) for d in range(2)}


async def reduce_pieces(rt: EvalRuntime, batch: str) -> list[tuple[str, int, int, str, dict]]:
    rows = await rt.store.execute(
        "SELECT p.path, p.round, p.seq, d.text, p.loc FROM herd_eval_pieces p"
        " JOIN herd_eval_documents d ON d.hash = p.doc"
        " WHERE p.batch = %(b)s AND p.stage = 'summary' ORDER BY 1, 2, 3",
        {"b": batch},
    )
    return [tuple(r) for r in rows]


async def test_a_reduce_larger_than_its_context_runs_in_rounds(app, sim, capsys):  # noqa: F811
    pipe = from_json(pipeline())
    await submit_pipeline_texts(app, pipe, TEXTS, batch="rounds")
    await drain(app)
    rt = await EvalRuntime.of(app)
    pieces = await reduce_pieces(rt, "rounds")
    spec = pipe.spec(pipe.stage("summary"))
    for path, pages in (("m0.md", 24), ("m1.md", 25)):
        mine = [p for p in pieces if p[0] == path]
        last = max(r for _, r, *_ in mine)
        assert last > 1  # more than one round
        # One final reduce per document: the last round is one piece, reading all.
        assert [(r, s) for _, r, s, *_ in mine if r == last] == [(last, 0)]
        assert mine[-1][4]["pieces"] == [0, pages - 1]
        # Round 1 reads every map answer once, in document order, in batches that fit
        # (two answers at least in a batch, so the rounds end).
        first = [json.loads(t) for _, r, _, t, _ in mine if r == 1]
        assert [a["piece"] for b in first for a in b] == list(range(pages))
        for batch in first:
            assert len(batch) == 2 or count_text(canonical(batch), "sim-reduce") <= room(
                spec, SMALL
            )
        # Each later round reads the answers of the one before, in order.
        for r in range(2, last + 1):
            read = [json.loads(t) for _, rr, _, t, _ in mine if rr == r]
            before = [p for p in mine if p[1] == r - 1]
            assert [a["part"] for b in read for a in b] == list(range(len(before)))
    # The final answer: one per document, the last round's, saying how many rounds.
    rows = [r async for r in results.rows(app, "rounds")]
    assert [(r["status"], set(r["output"])) for r in rows] == [("done", {"summary"})] * 2
    assert sim.stats()["by_model"]["sim-reduce"] == len(pieces)
    # Seen per stage: the round it reached, and each reduce piece's round.
    status = await batch_status(app, "rounds")
    (summary,) = [s for s in status.stages if s["stage"] == "summary"]
    assert summary["round"] > 1 and summary["done"] == summary["pieces"] == len(pieces)
    print_stages(status.stages)
    assert f"reduce, round {summary['round']}" in capsys.readouterr().out
    shown = [r async for r in stage_rows(app, "rounds", "summary")]
    assert [(r["path"], r["round"], r["piece"]) for r in shown] == [p[:3] for p in pieces]

    # The same documents again: every round answered from the cache, no call made.
    calls = sim.stats()["calls"]
    await submit_pipeline_texts(app, pipe, TEXTS, batch="again")
    await drain(app)
    assert sim.stats()["calls"] == calls
    again = {s["stage"]: s for s in await stage_progress(rt, "again")}
    assert again["summary"]["calls"] == 0
    assert again["summary"]["cached"] == again["summary"]["pieces"] == len(pieces)
    assert (await batch_status(app, "again")).done == 2


async def test_a_reduce_that_fits_is_one_call_over_all_the_answers(app, sim):  # noqa: F811
    await submit_pipeline_texts(app, from_json(pipeline(context=32768)), TEXTS, batch="whole")
    await drain(app)
    rt = await EvalRuntime.of(app)
    pieces = await reduce_pieces(rt, "whole")
    assert [(p, r, s) for p, r, s, *_ in pieces] == [("m0.md", 1, 0), ("m1.md", 1, 0)]
    assert [len(json.loads(t)) for *_, t, _ in pieces] == [24, 25]


def test_batches_fit_the_room_and_always_shrink():
    spec = from_json(pipeline()).spec(from_json(pipeline()).stage("summary"))
    items = [{"piece": i, "answer": "x" * 90} for i in range(40)]
    batches = group(items, spec, SMALL)
    assert [i for b in batches for i in b] == items
    assert all(count_text(canonical(b), "m") <= room(spec, SMALL) for b in batches)
    # Items each larger than the room: two a batch, so that every round halves the count.
    huge = [{"piece": i, "answer": "y" * 2000} for i in range(5)]
    assert [len(b) for b in group(huge, spec, SMALL)] == [2, 2, 1]


def test_the_progress_line_names_the_round_under_way():
    stage = {"failed": 0, "cancelled": 0}
    status = BatchStatus(batch="b", documents=2, queued=2, stages=[
        {**stage, "stage": "notes", "pieces": 48, "done": 48, "round": 1},
        {**stage, "stage": "summary", "pieces": 9, "done": 7, "round": 2}])  # fmt: skip
    assert summary(status) == "0/2 answered, summary round 2 7/9, 2 queued"
