"""A pipeline's plan before paying (herd.llm.eval.pipeplan) and its calls moving to a
fallback while a stage's model is down: on the real queue and store, the simulator as
the provider, its bill and herd's ledger as what was paid."""

from __future__ import annotations

import json
from decimal import Decimal

import psycopg
import pytest

from herd import App, Worker
from herd.errors import InvalidInput
from herd.limits.tokens import register_tokenizer
from herd.llm import eval as evaluate
from herd.llm.eval import stages
from herd.llm.eval.fallback import breaker_of
from herd.llm.eval.pipeline import from_json
from herd.llm.eval.pipeplan import plan_pipeline_texts, render
from herd.llm.eval.pipesubmit import check_pipeline, submit_pipeline_texts
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.stageview import stage_progress
from herd.llm.eval.status import batch_status
from herd.testing.simulator.content import estimate_tokens
from tests.api.conftest import client_of
from tests.conftest import truncate
from tests.llm.conftest import SECRET, clean_eval_tables
from tests.llm.test_pipeline import NOTE, PIPE_TABLES, SUMMARY, manual
from tests.test_cli import herd

MODEL = "sim-pipeplan"  # a tokenizer is registered for it: the simulator's own count
PRICES = {MODEL: {"input": 0.40, "output": 1.60}, "claude-pipefb": {"input": 3.0, "output": 15.0}}
BOUNDED = {**NOTE, "properties": {"finding": {"type": "string", "maxLength": 60},
                                  "severity": {"type": "integer", "minimum": 1,
                                               "maximum": 5}}}  # fmt: skip


def pipeline(reduce_prompt: str = "Summarise the findings.") -> dict:
    return {"name": "plan-test", "defaults": {"model": MODEL}, "stages": [
        {"name": "sections", "kind": "split", "by": "headings", "depth": 2},
        {"name": "notes", "kind": "map", "prompt": "Note the finding.", "schema": BOUNDED},
        {"name": "summary", "kind": "reduce", "prompt": reduce_prompt, "schema": SUMMARY},
    ]}  # fmt: skip


def documents() -> dict[str, str]:
    # Three manuals; the third repeats the first (its sections are paid once).
    texts = {f"m{d}.md": manual(f"Device {d}", 3 + d) for d in range(2)}
    return {**texts, "again.md": texts["m0.md"]}


@pytest.fixture
async def app(pg_url, sim, monkeypatch, tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(PRICES))
    monkeypatch.setenv("HERD_PRICES", str(prices))
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", sim.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("HERD_FALLBACK_COOLDOWN", "600")
    register_tokenizer(MODEL, estimate_tokens)
    truncate(pg_url)
    clean_eval_tables(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {PIPE_TABLES}")
    the_app = App(database_url=pg_url)
    the_app.task(name=stages.STAGE_TASK, queue=evaluate.QUEUE, lease_seconds=30.0,
                 max_attempts=2)(stages.run_stage)  # fmt: skip
    async with the_app:
        yield the_app


async def drain(app: App) -> None:
    await Worker(app, queues=[evaluate.QUEUE], concurrency=4, poll_interval=0.05,
                 stop_when_idle=True, install_signal_handlers=False).run()  # fmt: skip


async def ledger(app: App, batch: str) -> tuple[int, int, Decimal]:
    """The map stage's paid calls, input tokens and dollars, by the ledger's rows."""
    rt = await EvalRuntime.of(app)
    rows = await rt.store.execute(
        "SELECT count(*), coalesce(sum(l.input_tokens), 0), coalesce(sum(l.cost), 0)"
        " FROM herd_eval_ledger l WHERE l.batch = %s AND l.kind = 'call' AND l.key IN"
        " (SELECT key FROM herd_eval_pieces WHERE batch = %s AND stage = 'notes')",
        (batch, batch),
    )
    n, i, cost = rows[0]
    return int(n), int(i), Decimal(str(cost))


async def jobs(app: App) -> int:
    rt = await EvalRuntime.of(app)
    return int((await rt.store.execute("SELECT count(*) FROM herd_jobs"))[0][0])


async def test_the_planned_map_is_what_the_ledger_records_and_a_rerun_plans_what_changed(app, sim):
    docs = documents()
    pipe = from_json(pipeline())
    plan = await plan_pipeline_texts(app, pipe, docs)
    split, notes, summary = plan.stages
    # m0: intro + 3 registers, m1: intro + 4, again.md: m0's 4 again.
    assert (split.kind, split.inputs) == ("split", 4 + 5 + 4)
    assert (notes.inputs, notes.unique, notes.cached, notes.calls) == (13, 9, 0, 9)
    assert notes.estimated == 0  # the map's inputs are known: the split is exact
    # The reduces read answers not made yet: estimated, one per distinct document.
    assert (summary.inputs, summary.calls, summary.estimated) == (3, 2, 2)
    assert all(len(line) <= 80 for line in render(plan)), render(plan)
    assert any(line.startswith("  ~ estimated: 2 calls") for line in render(plan))
    assert await jobs(app) == 0 and sim.stats()["calls"] == 0  # a plan enqueues nothing

    await submit_pipeline_texts(app, pipe, docs, batch="planned")
    await drain(app)
    calls, tokens, cost = await ledger(app, "planned")
    # The map stage: its calls exactly; its input tokens as the model's tokenizer counts
    # them, plus the limiter's overhead per request and message (which the simulator does
    # not count); its dollars differ by the output too, planned at the schema's bound.
    assert calls == notes.calls
    assert tokens <= notes.input_tokens <= tokens + calls * (3 + 2 * 4) + 3
    assert notes.usd is not None and cost <= notes.usd
    input_usd = Decimal(tokens) * Decimal("0.40") / 10**6
    assert input_usd < cost
    rt = await EvalRuntime.of(app)
    progress = {s["stage"]: s for s in await stage_progress(rt, "planned")}
    assert progress["notes"]["calls"] == notes.calls
    assert progress["summary"]["calls"] == summary.calls

    # Planned again: every answer is cached, the reduces' inputs are made exactly from
    # the map's cached answers and found answered too: nothing to pay.
    again = await plan_pipeline_texts(app, pipe, docs)
    assert [(s.cached, s.calls, s.estimated) for s in again.stages[1:]] == [(9, 0, 0), (2, 0, 0)]
    assert again.usd == Decimal(0)
    # Only the reduce prompt changed: the plan knows the reduces' inputs (exact, no
    # estimate) and that they are the only calls to pay.
    changed = await plan_pipeline_texts(app, from_json(pipeline("Summarise it tersely.")),
                                        docs)  # fmt: skip
    assert [(s.calls, s.estimated) for s in changed.stages[1:]] == [(0, 0), (2, 0)]
    assert not any("estimated" in line for line in render(changed))


async def test_cli_and_api_plan_a_pipeline_and_enqueue_nothing(app, sim, pg_url, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in documents().items():
        (folder / name).write_text(text)
    (tmp_path / "note.json").write_text(json.dumps(BOUNDED))
    spec = tmp_path / "pipeline.toml"
    spec.write_text(
        f'name = "plan-test"\n[defaults]\nmodel = "{MODEL}"\n'
        '[[stages]]\nname = "sections"\nkind = "split"\nby = "headings"\ndepth = 2\n'
        f'[[stages]]\nname = "notes"\nkind = "map"\nprompt = "Note it."\n'
        'schema_file = "note.json"\n'
        '[[stages]]\nname = "summary"\nkind = "reduce"\nprompt = "Sum up."\n'
    )
    env = {"OPENAI_BASE_URL": sim.openai_url, "OPENAI_API_KEY": SECRET, "COLUMNS": "80",
           "HERD_PRICES": str(tmp_path / "prices.json")}  # fmt: skip
    args = ["eval", "submit", str(folder), "--pipeline", str(spec), "--plan", "--rpm", "60"]
    r = herd(*args, "--budget", "0.000001", url=pg_url, **env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "plan: pipeline plan-test, 3 documents, nothing enqueued or paid"
    assert all(len(line) <= 80 for line in lines), r.stdout
    assert any(line.split()[:2] == ["sections", "split"] for line in lines), r.stdout
    assert any("short by" in line and "it would park" in line for line in lines), r.stdout
    assert any("rpm 60; rpm binds" in line for line in lines), r.stdout
    as_json = json.loads(herd(*args, "--json", url=pg_url, **env).stdout)
    assert [(s["stage"], s["calls"]) for s in as_json["stages"]] == [
        ("sections", 0), ("notes", 9), ("summary", 2)]  # fmt: skip
    assert as_json["estimated_calls"] == 2 and as_json["minutes"] > 0
    # A mistake in a stage is refused as the submission would be: one line, exit 2.
    bad = herd(*args, "--fallback", "nocolon", url=pg_url, **env)
    assert bad.returncode == 2 and "must be provider:model" in bad.stderr, bad.stderr
    body = {"pipeline": pipeline(), "plan": True,
            "documents": [{"name": n, "text": t} for n, t in documents().items()]}  # fmt: skip
    async with client_of(app) as client:
        answered = await client.post("/evals", json=body)
        assert answered.status_code == 200, answered.text
        assert [s["calls"] for s in answered.json()["stages"]] == [0, 9, 2]
    assert await jobs(app) == 0 and sim.stats()["calls"] == 0


def test_fallbacks_are_checked_for_every_stage_before_anything_is_stored(app):
    both = pipeline()
    both["stages"][2] = {**both["stages"][2], "model": "claude-pipefb", "provider": "anthropic"}
    with pytest.raises(InvalidInput, match="stage 'summary': fallback anthropic:claude-pipefb"
                       " is named twice"):  # fmt: skip
        check_pipeline(from_json(both), app.settings, fallbacks=["anthropic:claude-pipefb"])
    with pytest.raises(InvalidInput, match="stage 'notes': fallback anthropic:unpriced has no"):
        check_pipeline(from_json(pipeline()), app.settings, budget=1.0,
                       fallbacks=["anthropic:unpriced"])  # fmt: skip


async def test_a_stage_whose_model_is_down_moves_to_the_fallback(app, sim):
    sim.configure(spells=[{"model": MODEL, "status": 529, "for": 600}])
    docs = {"pump.md": manual("Pump", 2)}
    await submit_pipeline_texts(app, from_json(pipeline()), docs, batch="outage",
                                budget=5.0, fallbacks=["anthropic:claude-pipefb"])  # fmt: skip
    await drain(app)
    status = await batch_status(app, "outage")
    assert (status.done, status.dead) == (1, 0), status.failures
    rt = await EvalRuntime.of(app)
    # Every stage's calls were the fallback's, billed at its price, against one budget.
    paid = await rt.store.execute(
        "SELECT DISTINCT provider, model FROM herd_eval_ledger WHERE batch = 'outage'"
        " AND kind = 'call'"
    )
    assert paid == [("anthropic", "claude-pipefb")]
    answers = await rt.store.execute(
        "SELECT stage, result->>'model' FROM herd_eval_pieces WHERE batch = 'outage'"
    )
    assert {m for _, m in answers} == {"claude-pipefb"} and len(answers) == 3 + 1
    # Each stage's cost counts the fallback's calls (found by the pieces' jobs).
    progress = {s["stage"]: s for s in await stage_progress(rt, "outage")}
    assert (progress["notes"]["calls"], progress["summary"]["calls"]) == (3, 1)
    assert progress["notes"]["cost"] and 0 < (status.spent or 0) <= 5.0
    # Cached under the fallback's key, never the model's own.
    pieces = await rt.store.execute(
        "SELECT key FROM herd_eval_pieces WHERE batch = 'outage' AND stage = 'notes'"
    )
    assert [await rt.cache.get(k) for (k,) in pieces] == [None] * 3
    assert sim.stats()["spell_errors"].get(MODEL, 0) >= 1
    assert breaker_of(app).passed_over(from_json(pipeline()).spec(from_json(pipeline()).calls[0]))
