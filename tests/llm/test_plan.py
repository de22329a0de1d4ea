"""A plan before paying (herd.llm.eval.plan): nothing enqueued, the same refusals as a
submission, and planned dollars close to what the ledger records once the batch has run
on the simulator, synchronously and through the Batch API, with a shared rubric."""

from __future__ import annotations

import json
import math
from decimal import Decimal

import pytest

from herd import App
from herd.limits import Limit
from herd.limits.tokens import register_tokenizer
from herd.llm import eval as evaluate
from herd.llm.eval import EvalRuntime, EvalSpec, batch_status, batchapi, enqueue_documents
from herd.llm.eval.plan import estimate, plan_items, render
from herd.llm.eval.submit import enqueue_batch_documents
from herd.llm.pricing import Price
from herd.testing.simulator.content import estimate_tokens
from tests.api.conftest import client_of
from tests.conftest import truncate
from tests.llm.conftest import SECRET, clean_eval_tables, run_until
from tests.test_cli import herd

MODEL = "sim-plan-test"  # a tokenizer is registered for it alone: the simulator's count
PRICES = {MODEL: {"input": 0.40, "cached_input": 0.10, "output": 1.60}}
SCHEMA = {
    "type": "object",
    "properties": {
        "clarity": {"type": "integer", "minimum": 1, "maximum": 5},
        "label": {"enum": ["good", "fair", "poor"]},
    },
    "required": ["clarity", "label"],
    "additionalProperties": False,
}
# ~2,500 tokens: past OpenAI's 1,024-token prompt-cache minimum.
RUBRIC = "Grade the report on clarity, evidence and structure; be strict. " * 160
# A bound looser than the benchmark's (bench/plan_accuracy.py: within 10 %): these
# documents are shorter, so the output's bound weighs more.
TOLERANCE = 0.15


def docs(n: int, tag: str) -> list[tuple[str, str]]:
    body = "The survey measured the river, the harvest and the budget of the council. " * 40
    return [(f"{tag}{i}.txt", f"Report {tag} {i}.\n{body}") for i in range(n)]


@pytest.fixture
async def app(pg_url, sim, monkeypatch, tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(PRICES))
    monkeypatch.setenv("HERD_PRICES", str(prices))
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    sim.configure(batch_latency=0.2)
    register_tokenizer(MODEL, estimate_tokens)
    truncate(pg_url)
    clean_eval_tables(pg_url)
    the_app = App(database_url=pg_url)
    the_app.task(name=evaluate.TASK, queue=evaluate.QUEUE, lease_seconds=5.0)(
        evaluate.task.evaluate
    )
    the_app.task(name=evaluate.spec.SUBMIT_TASK, queue=evaluate.QUEUE, lease_seconds=5.0)(
        batchapi.batch_submit
    )
    the_app.task(name=evaluate.spec.POLL_TASK, queue=evaluate.QUEUE, lease_seconds=5.0)(
        batchapi.batch_poll
    )
    async with the_app:
        yield the_app


async def billed(app: App, batch: str) -> Decimal:
    rt = await EvalRuntime.of(app)
    rows = await rt.store.execute(
        "SELECT coalesce(sum(cost), 0) FROM herd_eval_ledger WHERE batch = %s"
        " AND kind IN ('call', 'lost', 'failed', 'cut_short')",
        (batch,),
    )
    return Decimal(rows[0][0])


async def jobs(app: App) -> int:
    rt = await EvalRuntime.of(app)
    rows = await rt.store.execute("SELECT count(*) FROM herd_jobs")
    return int(rows[0][0])


@pytest.mark.parametrize("batch_api", [False, True], ids=["sync", "batch-api"])
async def test_planned_dollars_match_the_ledger_after_the_run(app, sim, batch_api):
    spec = EvalSpec(model=MODEL, system=RUBRIC, schema=SCHEMA)
    items = docs(12, "b" if batch_api else "s")
    items.append(("again.txt", items[0][1]))  # a duplicate: one call for both
    plan = await plan_items(app, spec, items, batch_api=batch_api)
    assert (plan.documents, plan.unique, plan.cached, plan.calls) == (13, 12, 0, 12)
    assert plan.tokenizer == "registered"
    # The rubric is read from the provider's cache by every call after the first.
    assert plan.prefix_tokens > 1024 and plan.cache_share > 0.3
    assert await jobs(app) == 0  # a plan enqueues nothing
    assert sim.stats()["billed"] == 0
    if batch_api:
        await enqueue_batch_documents(app, spec, "planned", items)
    else:
        await enqueue_documents(app, spec, "planned", items)

    async def finished() -> bool:
        return (await batch_status(app, "planned")).finished

    await run_until(app, finished, concurrency=4)
    cost = await billed(app, "planned")
    assert plan.usd is not None and cost > 0
    assert abs(plan.usd - cost) / cost < TOLERANCE, (plan.usd, cost)
    # Run again, the plan finds every answer in herd's cache: nothing to pay.
    again = await plan_items(app, spec, items, batch_api=batch_api)
    assert (again.cached, again.calls, again.usd) == (12, 0, Decimal(0))


def test_time_at_the_limits_and_eighty_columns():
    spec = EvalSpec(model="m-plan-rule", system="Rate it.", schema=SCHEMA)
    texts = [f"document {i} " * 30 for i in range(120)]
    price = Price(1.0, 2.0)
    plan = estimate(spec, texts, price, default_max=1024, batch_api=False, has_batch=True,
                    limits=[Limit(rpm=60), Limit(tpm=10**9)])  # fmt: skip
    assert (plan.minutes, plan.binds, plan.limits) == (2.0, "rpm", {"rpm": 60})
    # The rule counts at least every 3 ASCII characters as a token: a ceiling.
    assert plan.input_tokens >= sum(math.ceil(len(t) / 3) for t in texts)
    assert plan.batch_usd is not None and plan.sync_usd is not None
    assert plan.batch_usd < plan.sync_usd
    lines = render(plan)
    assert all(len(line) <= 80 for line in lines)
    assert any("2 min 00 s" in line and "rpm binds" in line for line in lines)


def test_a_plan_says_when_nothing_bounds_the_answer_and_how_to_bound_it():
    free = {"type": "object", "properties": {"claim": {"type": "string"}}}
    texts = ["a short paper"] * 3
    price = Price(1.0, 4.0)

    def plan_of(spec: EvalSpec) -> list[str]:
        plan = estimate(spec, texts, price, default_max=16384, batch_api=False, has_batch=True)
        assert plan.to_json()["output_bound"] == plan.output_bound
        return render(plan)

    unbounded = plan_of(EvalSpec(model="m", system="Claim?", schema=free))
    assert any("a ceiling" in line for line in unbounded)
    assert any('"max_tokens" to --params' in line for line in unbounded)
    assert all(len(line) <= 80 for line in unbounded)
    for bounded in (EvalSpec(model="m", system="Rate it.", schema=SCHEMA),
                    EvalSpec(model="m", system="Claim?", schema=free,
                             params={"max_tokens": 64})):  # fmt: skip
        assert not any("a ceiling" in line for line in plan_of(bounded))


async def test_cli_plan_enqueues_nothing_and_is_refused_like_a_submission(
    app, sim, pg_url, tmp_path
):
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in docs(3, "c"):
        (folder / name).write_text(text)
    (folder / "broken.pdf").write_text("not a pdf")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(RUBRIC)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    env = {"OPENAI_BASE_URL": sim.openai_url, "OPENAI_API_KEY": SECRET, "COLUMNS": "80"}
    args = ["eval", "submit", str(folder), "--prompt", str(prompt), "--schema", str(schema),
            "--model", "gpt-4.1-mini", "--plan"]  # fmt: skip
    r = herd(*args, url=pg_url, **env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("plan: openai:gpt-4.1-mini, nothing enqueued")
    assert all(len(line) <= 80 for line in lines), r.stdout
    assert "broken.pdf" in r.stderr
    as_json = json.loads(herd(*args, "--json", url=pg_url, **env).stdout)
    assert (as_json["documents"], as_json["unique"], as_json["calls"]) == (4, 3, 3)
    assert as_json["sync_usd"] > as_json["batch_usd"] > 0
    # Refused as the submission would be: exit 2, one line, nothing stored.
    refused = herd(*args, "--batch-api", "--budget", "1", url=pg_url, **env)
    assert refused.returncode == 2 and "batch_api" in refused.stderr
    assert await jobs(app) == 0
    assert sim.stats()["billed"] == 0


async def test_api_plan_answers_200_and_enqueues_nothing(app, sim):
    body = {"model": MODEL, "system": RUBRIC, "schema": SCHEMA, "plan": True,
            "documents": [{"name": n, "text": t} for n, t in docs(3, "a")]}  # fmt: skip
    async with client_of(app) as client:
        r = await client.post("/evals", json=body)
        assert r.status_code == 200, r.text
        assert (r.json()["calls"], r.json()["unique"]) == (3, 3)
        refused = await client.post("/evals", json={**body, "batch_api": True, "budget": 1})
        assert refused.status_code == 422
    assert await jobs(app) == 0
    assert sim.stats()["billed"] == 0


def test_anthropic_prefix_is_written_once_then_read_at_its_rates():
    # A registered tokenizer: 4 characters a token, so the figures are exact.
    register_tokenizer("claude-plan-test", estimate_tokens)
    system = "abcd" * 1500  # 1,500 tokens: past Sonnet's 1,024 minimum
    spec = EvalSpec(model="claude-plan-test", system=system, provider="anthropic",
                    params={"max_tokens": 10})  # fmt: skip
    price = Price.of("claude-plan-test", 3.0, 15.0)  # reads 0.1 x, writes 1.25 x
    plan = estimate(spec, ["efgh" * 100] * 3, price, default_max=4096, batch_api=False,
                    has_batch=True)  # fmt: skip
    i = 3 + (4 + 1500) + (4 + 100)  # the limiter's estimate: per request and message
    assert (plan.prefix_tokens, plan.cached_input_tokens) == (1500, 2 * 1500)
    first = (i - 1500) * 3.0 + 1500 * 3.0 * 1.25 + 10 * 15.0
    others = (i - 1500) * 3.0 + 1500 * 0.3 + 10 * 15.0
    assert plan.sync_usd == pytest.approx(Decimal(str((first + 2 * others) / 1e6)))
    off = EvalSpec(model="claude-plan-test", system=system, provider="anthropic",
                   params={"max_tokens": 10, "prompt_cache": False})  # fmt: skip
    assert estimate(off, ["x", "y"], price, default_max=4096, batch_api=False,
                    has_batch=True).prefix_tokens == 0  # fmt: skip
