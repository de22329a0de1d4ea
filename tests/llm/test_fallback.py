"""Fallbacks end to end on the simulator: while the batch's model is down (a spell of
529s) its calls move to the fallback, whose answers are cached, billed and reported
under the fallback's model; once the model answers again calls move back, and an answer
a fallback gave is never served as the model's own."""

from __future__ import annotations

import json
from typing import Any

import pytest

from herd import App
from herd.errors import InvalidInput
from herd.llm import eval as evaluate
from herd.llm.eval import EvalRuntime, EvalSpec, batch_status, enqueue_documents
from herd.llm.eval import results as export
from herd.llm.eval.fallback import breaker_of
from herd.llm.eval.fallback import specs as fallback_specs
from tests.conftest import truncate
from tests.helpers import eventually
from tests.llm.conftest import SECRET, clean_eval_tables, run_until

PRICES = {"sim-main": {"input": 1.0, "output": 2.0}, "claude-fb": {"input": 3.0, "output": 15.0}}
SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["score"],
    "additionalProperties": False,
}
SPEC = EvalSpec(model="sim-main", system="Rate the report from 1 to 5.", schema=SCHEMA)
FALLBACKS = ["anthropic:claude-fb"]
FALLBACK = fallback_specs(SPEC, FALLBACKS)[0]


def docs(tag: str, n: int = 6) -> list[tuple[str, str]]:
    return [(f"{tag}{i}.txt", f"Report {tag} number {i}: the river rose.") for i in range(n)]


@pytest.fixture
async def app(pg_url, sim, monkeypatch, tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(PRICES))
    monkeypatch.setenv("HERD_PRICES", str(prices))
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", sim.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("HERD_FALLBACK_COOLDOWN", "1")
    truncate(pg_url)
    clean_eval_tables(pg_url)
    the_app = App(database_url=pg_url)
    the_app.task(name=evaluate.TASK, queue=evaluate.QUEUE, lease_seconds=30.0, max_attempts=2)(
        evaluate.task.evaluate
    )
    async with the_app:
        yield the_app


async def run(
    app: App, batch: str, items: list[tuple[str, str]], concurrency: int = 2, **kw: Any
) -> list[dict]:
    await enqueue_documents(app, SPEC, batch, items, **kw)

    async def finished() -> bool:
        return (await batch_status(app, batch)).finished

    await run_until(app, finished, concurrency=concurrency)
    rt = await EvalRuntime.of(app)
    rows = await rt.store.execute(
        "SELECT status, result FROM herd_eval_items WHERE batch = %s ORDER BY path", (batch,)
    )
    assert all(s == "done" for s, _ in rows), rows
    return [r for _, r in rows]


async def paid(app: App, batch: str) -> set[tuple[str, str]]:
    rt = await EvalRuntime.of(app)
    rows = await rt.store.execute(
        "SELECT DISTINCT provider, model FROM herd_eval_ledger WHERE batch = %s AND kind = 'call'",
        (batch,),
    )
    return {(p, m) for p, m in rows}


async def test_calls_move_to_the_fallback_while_the_model_is_down_and_back_after(app, sim):
    sim.configure(spells=[{"model": "sim-main", "status": 529, "for": 600}])
    down = docs("d")
    results = await run(app, "outage", down, budget=5.0, fallbacks=FALLBACKS)
    # Every answer is the fallback's, and says so.
    assert {(r["model"], r.get("provider"), r.get("fallback")) for r in results} == {
        ("claude-fb", "anthropic", 1)
    }
    assert await paid(app, "outage") == {("anthropic", "claude-fb")}
    status = await batch_status(app, "outage")
    assert 0 < (status.spent or 0) <= 5.0  # one budget, the fallback's own price
    rt = await EvalRuntime.of(app)
    for _, text in down:
        assert await rt.cache.get(SPEC.key(text)) is None  # never under the model's key
        assert await rt.cache.get(FALLBACK.key(text)) is not None
    assert sim.stats()["spell_errors"].get("sim-main", 0) >= 1
    # The results name each answer's model, and its cost is its own call's.
    exported = [row async for row in export.rows(app, "outage")]
    assert {(r["model"], r["source"]) for r in exported} == {("claude-fb", "call")}
    assert all(r["cost"] and r["input_tokens"] for r in exported)

    # The model answers again: once the cooldown is over, calls move back to it.
    sim.configure(spells=[])
    breaker = breaker_of(app)
    await eventually(lambda: not breaker.passed_over(SPEC), timeout=10)
    # One call probes it (concurrent ones keep to the fallback until it is answered):
    # one at a time, every call after the probe is the model's.
    back = await run(app, "recovered", docs("r"), concurrency=1, fallbacks=FALLBACKS)
    assert {(r["model"], r.get("fallback")) for r in back} == {("sim-main", None)}
    # The documents the fallback answered are asked of the model itself, not served
    # the fallback's cached answers.
    again = await run(app, "again", down, fallbacks=FALLBACKS)
    assert {(r["model"], r["source"]) for r in again} == {("sim-main", "computed")}
    assert await paid(app, "again") == {("openai", "sim-main")}


async def test_without_a_fallback_a_down_model_is_the_jobs_failure(app, sim):
    sim.configure(spells=[{"model": "sim-main", "status": 529, "for": 600}])
    await enqueue_documents(app, SPEC, "alone", docs("a", 1))

    async def dead() -> bool:
        return (await batch_status(app, "alone")).dead == 1

    await run_until(app, dead)
    assert await paid(app, "alone") == set()


@pytest.mark.parametrize(
    ("fallbacks", "kw", "message"),
    [
        (["claude-fb"], {}, "must be provider:model"),
        (["acme:m"], {}, "provider 'acme' is not known"),
        (["openai:sim-main"], {}, "named twice"),
        (["anthropic:unpriced"], {"budget": 1.0}, "has no price"),
        (FALLBACKS, {"batch_api": True}, "fallbacks are not kept through the Batch API"),
    ],
)
def test_bad_fallbacks_are_refused_before_anything_is_stored(app, fallbacks, kw, message):
    with pytest.raises(InvalidInput, match=message):
        evaluate.check_submission(SPEC, app.settings, fallbacks=fallbacks, **kw)
