"""Several stages per piece (a map reading another map's answer, piece for piece) and
Python functions as stages (per piece, per document): no model call for a function, no
ledger row, cached by what it reads like a call."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from herd import Worker
from herd.errors import InvalidInput
from herd.jsonvalue import canonical
from herd.llm import eval as evaluate
from herd.llm.eval import results
from herd.llm.eval.pipeline import from_json
from herd.llm.eval.pipesubmit import submit_pipeline_texts
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.stageview import stage_progress, stage_rows
from herd.llm.eval.status import batch_status
from tests.llm.test_pipeline import NOTE, VERDICT, app, drain, manual  # noqa: F401

RAN: Counter[str] = Counter()


def tidy(note: dict) -> dict:
    """A function per piece, found by import (tests.llm.test_pipeline_steps.tidy)."""
    RAN["tidy"] += 1
    return {"finding": note["finding"].upper(), "severity": min(note["severity"], 5)}


async def tally(verdicts: list) -> dict:
    """A function per document over the answers of the stage per piece before it."""
    RAN["tally"] += 1
    return {"pieces": len(verdicts),
            "ok": sum(1 for v in verdicts if v.get("answer", {}).get("ok"))}  # fmt: skip


def pipeline(tally_name: str = "tally-verdicts") -> dict:
    return {
        "defaults": {"model": "sim-1"},
        "stages": [
            {"name": "sections", "kind": "split", "by": "headings", "depth": 2},
            {"name": "notes", "kind": "map", "prompt": "Note it.", "schema": NOTE},
            {"name": "tidy", "kind": "function", "task": "tests.llm.test_pipeline_steps.tidy"},
            {"name": "judge", "kind": "map", "prompt": "Is it right?", "schema": VERDICT},
            {"name": "tally", "kind": "function", "task": tally_name, "per": "document"},
        ],
    }  # fmt: skip


TEXTS = {"a.md": manual("Valve", 3), "b.md": manual("Pump", 4)}
PIECES = 4 + 5


async def test_maps_and_functions_run_piece_for_piece_then_per_document(app, sim):  # noqa: F811
    app.task(name="tally-verdicts")(tally)
    RAN.clear()
    await submit_pipeline_texts(app, from_json(pipeline()), TEXTS, batch="steps")
    await drain(app)
    # Two maps: one call per piece each; the functions call no model.
    assert sim.stats()["calls"] == 2 * PIECES
    assert RAN == {"tidy": PIECES, "tally": 2}
    rt = await EvalRuntime.of(app)
    # The second map read the function's answer of the same piece, same location.
    tidied = [r async for r in stage_rows(app, "steps", "tidy")]
    judged = await rt.store.execute(
        "SELECT p.path, p.seq, d.text, p.loc FROM herd_eval_pieces p JOIN herd_eval_documents d"
        " ON d.hash = p.doc WHERE p.batch = 'steps' AND p.stage = 'judge' ORDER BY 1, 2"
    )
    assert [(p, s, json.loads(t), loc) for p, s, t, loc in judged] == [
        (r["path"], r["piece"], r["output"], r["loc"]) for r in tidied
    ]
    assert all(r["output"]["finding"] == r["output"]["finding"].upper() for r in tidied)
    # The last stage's answer per document: the function's, over the judge's answers.
    rows = [r async for r in results.rows(app, "steps")]
    assert [(r["path"], r["status"], r["output"]["pieces"]) for r in rows] == [
        ("a.md", "done", 4), ("b.md", "done", 5)]  # fmt: skip
    # The ledger knows only the model calls.
    ((ledger,),) = await rt.store.execute(
        "SELECT count(*) FROM herd_eval_ledger WHERE batch = 'steps' AND kind = 'call'"
    )
    assert ledger == 2 * PIECES
    progress = {s["stage"]: s for s in await stage_progress(rt, "steps")}
    assert [(n, progress[n]["kind"], progress[n]["done"], progress[n]["calls"])
            for n in ("notes", "tidy", "judge", "tally")] == [
        ("notes", "map", PIECES, PIECES), ("tidy", "function", PIECES, 0),
        ("judge", "map", PIECES, PIECES), ("tally", "function", 2, 0)]  # fmt: skip

    # Again under another name: every call and every function answered from the cache.
    await submit_pipeline_texts(app, from_json(pipeline()), TEXTS, batch="again")
    await drain(app)
    assert sim.stats()["calls"] == 2 * PIECES
    assert RAN == {"tidy": PIECES, "tally": 2}
    again = {s["stage"]: s for s in await stage_progress(rt, "again")}
    assert again["tidy"]["cached"] == PIECES and again["tally"]["cached"] == 2
    assert (await batch_status(app, "again")).done == 2


async def test_a_piece_dead_in_one_map_stays_a_marked_gap_in_the_next(app, sim):  # noqa: F811
    # The first map's second piece is answered invalid twice (its repair too): it dies.
    sim.configure(script=["ok", "invalid", "invalid"])
    pipe = from_json({
        "defaults": {"model": "sim-1"},
        "stages": [
            {"name": "sections", "kind": "split", "by": "headings", "depth": 2},
            {"name": "notes", "kind": "map", "prompt": "Note.", "schema": NOTE, "on_dead": "skip"},
            {"name": "judge", "kind": "map", "prompt": "Judge.", "schema": VERDICT,
             "on_dead": "skip"},
            {"name": "tally", "kind": "function", "task": "tests.llm.test_pipeline_steps.tally",
             "per": "document"},
        ],
    })  # fmt: skip
    await submit_pipeline_texts(app, pipe, {"pump.md": manual("Pump", 2)}, batch="gap")
    await Worker(app, queues=[evaluate.QUEUE], concurrency=1, poll_interval=0.05,
                 stop_when_idle=True, install_signal_handlers=False).run()  # fmt: skip
    judged = [r async for r in stage_rows(app, "gap", "judge")]
    assert [r["status"] for r in judged] == ["done", "failed", "done"]
    assert judged[1]["error"].startswith("stage 'notes': piece 1, section 'Pump › Register 1")
    (row,) = [r async for r in results.rows(app, "gap")]
    assert row["status"] == "done" and row["output"]["pieces"] == 3


def test_a_pipeline_in_steps_is_checked_whole_naming_the_stage():
    base = [{"name": "m", "kind": "map", "prompt": "x"}]
    cases = [
        ([*base, {"name": "r", "kind": "reduce", "prompt": "y"},
          {"name": "m2", "kind": "map", "prompt": "z"}],
         "stage 'm2': a map per piece must come before any stage per document"),
        ([*base, {"name": "m2", "kind": "map", "prompt": "z"},
          {"name": "r", "kind": "reduce", "prompt": "y", "over": "m"}],
         "stage 'r': over='m': reads the last stage per piece, 'm2'"),
        ([*base, {"name": "f", "kind": "function", "task": "x.y", "per": "document"},
          {"name": "r", "kind": "reduce", "prompt": "y"}],
         "stage 'r': one reduce, right after the maps"),
        ([*base, {"name": "f", "kind": "function", "task": "not a name"}],
         r"stages\.1\.function\.task: String should match pattern"),
    ]  # fmt: skip
    for stages_, message in cases:
        with pytest.raises(InvalidInput, match=message):
            from_json({"defaults": {"model": "m"}, "stages": stages_})


async def test_a_function_that_names_nothing_is_refused_before_anything_is_stored(app):  # noqa: F811
    rt = await EvalRuntime.of(app)
    for task, why in (("tests.llm.no_such_module.fn", "No module named"),
                      ("tests.llm.test_pipeline_steps.nothing", "has no function 'nothing'"),
                      ("unregistered", "is no task of the app")):  # fmt: skip
        with pytest.raises(InvalidInput, match=f"stage 'tally': .*{why}"):
            await submit_pipeline_texts(app, from_json(pipeline(task)), TEXTS, batch="never")
    assert not await rt.store.exists("never")
    assert canonical(await rt.store.execute("SELECT count(*) FROM herd_eval_pieces")) == "[[0]]"
