"""A pipeline's plan (herd.llm.eval.pipeplan) counts a reduce's rounds as the run makes
them, prices a stage through the Batch API at the batch price, and prints its dollars
exact (no float residue) in JSON."""

from __future__ import annotations

import json
from decimal import Decimal

from herd.llm.eval.pipeline import from_json
from herd.llm.eval.pipeplan import plan_pipeline_texts, render
from herd.llm.eval.pipesubmit import submit_pipeline_texts
from herd.llm.eval.runtime import EvalRuntime
from tests.api.conftest import client_of
from tests.llm.conftest import SECRET
from tests.llm.test_pipeline import NOTE, SUMMARY, app, drain, manual  # noqa: F401
from tests.llm.test_pipeline_rounds import TEXTS, reduce_pieces
from tests.llm.test_pipeline_rounds import pipeline as in_rounds
from tests.test_cli import herd


async def test_the_plan_counts_every_round_of_a_reduce_the_run_makes(app, sim):  # noqa: F811
    pipe = from_json(in_rounds())
    before = await plan_pipeline_texts(app, pipe, TEXTS)
    _, _, summary = before.stages
    # The answers are not made yet: estimated, but in rounds, more calls than documents.
    assert summary.rounds > 1 and summary.calls > len(TEXTS)
    assert any("summary: in" in line and "rounds" in line for line in render(before))
    assert all(len(line) <= 80 for line in render(before))

    await submit_pipeline_texts(app, pipe, TEXTS, batch="planned-rounds")
    await drain(app)
    rt = await EvalRuntime.of(app)
    pieces = await reduce_pieces(rt, "planned-rounds")
    # Planned again, every answer cached: the reduce's inputs are made exactly, round by
    # round, grouped as the run grouped them: one per reduce call the run made.
    after = await plan_pipeline_texts(app, pipe, TEXTS)
    _, notes, summary = after.stages
    assert (summary.inputs, summary.cached, summary.calls) == (len(pieces), len(pieces), 0)
    assert summary.rounds == max(r for _, r, *_ in pieces)
    assert notes.calls == 0 and after.calls == 0


async def test_a_batched_stage_is_planned_at_the_batch_price(app, sim, monkeypatch, tmp_path):  # noqa: F811
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"sim-1": {"input": 0.1, "output": 0.3}}))
    monkeypatch.setenv("HERD_PRICES", str(prices))
    pipe = from_json(in_rounds(context=32768))
    sync = await plan_pipeline_texts(app, pipe, TEXTS)
    batched = await plan_pipeline_texts(app, pipe.through_batch_api(), TEXTS)
    s, b = sync.stages[1], batched.stages[1]
    assert (s.calls, s.input_tokens, s.output_tokens) == (b.calls, b.input_tokens,
                                                          b.output_tokens)  # fmt: skip
    assert s.usd is not None and b.usd == s.usd / 2 and b.batch_api
    assert any(line.startswith("  Batch API: notes, summary") for line in render(batched))
    # The HTTP API: "batch_api" with a pipeline puts every model stage through it.
    body = {"pipeline": in_rounds(context=32768), "plan": True, "batch_api": True,
            "documents": [{"name": n, "text": t} for n, t in TEXTS.items()]}  # fmt: skip
    async with client_of(app) as client:
        answered = await client.post("/evals", json=body)
    assert answered.status_code == 200, answered.text
    stages = answered.json()["stages"]
    assert [s["batch_api"] for s in stages] == [False, True, True]
    assert Decimal(repr(stages[1]["usd"])) == b.usd


def _amounts(value: object) -> list[float]:
    if isinstance(value, dict):
        return [v for k, x in value.items() for v in ([x] if k == "usd" else _amounts(x))]
    if isinstance(value, list):
        return [v for x in value for v in _amounts(x)]
    return []


async def test_plan_json_prints_exact_dollars(app, sim, pg_url, tmp_path):  # noqa: F811
    # Rates whose float products leave residues (the sum of the float costs of these
    # calls is 0.005780199999999999, of the map's 0.0015224999999999995).
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"sim-1": {"input": 0.7, "output": 0.1}}))
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in TEXTS.items():
        (folder / name).write_text(text)
    (tmp_path / "note.json").write_text(json.dumps(NOTE))
    spec = tmp_path / "pipeline.toml"
    spec.write_text(
        '[defaults]\nmodel = "sim-1"\n'
        '[[stages]]\nname = "sections"\nkind = "split"\nby = "headings"\n'
        '[[stages]]\nname = "notes"\nkind = "map"\nprompt = "Note it."\n'
        'schema_file = "note.json"\nparams = { max_tokens = 77 }\n'
        '[[stages]]\nname = "summary"\nkind = "reduce"\nprompt = "Sum."\n'
        "params = { max_tokens = 33 }\n"
    )
    env = {"OPENAI_BASE_URL": sim.openai_url, "OPENAI_API_KEY": SECRET, "COLUMNS": "80",
           "HERD_PRICES": str(prices)}  # fmt: skip
    for extra in ([], ["--batch-api"]):
        r = herd("eval", "submit", str(folder), "--pipeline", str(spec), "--plan", "--json",
                 *extra, url=pg_url, **env)  # fmt: skip
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        amounts = _amounts(out)
        assert len(amounts) == 4 and amounts[0] is None and all(a > 0 for a in amounts[1:])
        for a in amounts[1:]:
            # Whole tokens at rates of tenths of a dollar per million (halved in a
            # batch): exact to 1e-8 dollars; a float residue runs to 17 digits.
            assert Decimal(repr(a)).as_tuple().exponent >= -8, r.stdout
        assert Decimal(repr(amounts[3])) == Decimal(repr(amounts[1])) + Decimal(repr(amounts[2]))
        assert [s["batch_api"] for s in out["stages"][1:]] == [bool(extra)] * 2
