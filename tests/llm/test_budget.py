"""Budgets: each call reserves its worst case first; past the budget the batch parks
(nothing dead-lettered), and raising the budget finishes it. And the ledger's rows:
opened before the call, closed after, cut short when the worker died mid-call."""

from __future__ import annotations

import asyncio
import json

import pytest

from herd import App, JobStatus, Worker
from herd.errors import InvalidInput
from herd.llm import eval as evaluate
from herd.llm.eval import EvalSpec, enqueue_documents
from herd.llm.eval.spec import reservation_tokens
from herd.locks import PostgresLocks
from tests.conftest import truncate
from tests.helpers import eventually
from tests.llm.conftest import clean_eval_tables

# One token costs $0.001 either way, so the worst case of a call is easy to state.
PRICES = {"sim-budget": {"input": 1000.0, "output": 1000.0}}
SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer"}, "summary": {"type": "string"}},
    "required": ["score", "summary"],
}
# The simulator answers in well under 60 tokens and counts 4 characters a token (the
# estimate counts 3): actual costs stay under the worst case, and close to it.
SPEC = EvalSpec(model="sim-budget", system="Rate it.", schema=SCHEMA, params={"max_tokens": 60})
CONCURRENCY = 8


@pytest.fixture
async def app(pg_url, sim, monkeypatch, tmp_path):
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(PRICES))
    monkeypatch.setenv("HERD_PRICES", str(prices))
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET")
    truncate(pg_url)
    clean_eval_tables(pg_url)
    the_app = App(database_url=pg_url)
    the_app.task(name=evaluate.TASK, queue=evaluate.QUEUE, lease_seconds=5.0, max_attempts=2)(
        evaluate.task.evaluate
    )
    async with the_app:
        yield the_app


def documents(n: int) -> list[tuple[str, str]]:
    body = "The paper measures things carefully and reports them. " * 12
    return [(f"d{i}.txt", f"Document number {i} on topic {i * 7}. {body}") for i in range(n)]


def worst_case(text: str) -> float:
    i, o = reservation_tokens(SPEC, text)
    return (i + o) / 1000


async def spend(app: App, batch: str) -> tuple[float, dict[str, int]]:
    rt = await evaluate.EvalRuntime.of(app)
    rows = await rt.store.execute(
        "SELECT kind, count(*), coalesce(sum(cost), 0)::float8 FROM herd_eval_ledger"
        " WHERE batch = %s AND kind IN ('call', 'lost', 'failed', 'cut_short') GROUP BY kind",
        (batch,),
    )
    return sum(c for _, _, c in rows), {k: n for k, n, _ in rows}


async def test_spend_stays_within_budget_plus_in_flight_reservations_then_resumes(app, sim):
    sim.configure(latency=[0.15, 0.25])
    docs = documents(40)
    worst = max(worst_case(text) for _, text in docs)
    budget = 20 * worst
    await enqueue_documents(app, SPEC, "capped", docs, budget=budget, limits={"rpm": 600})
    worker = Worker(app, queues=[evaluate.QUEUE], concurrency=CONCURRENCY, poll_interval=0.05,
                    install_signal_handlers=False)  # fmt: skip
    run = asyncio.create_task(worker.run())
    try:

        async def parked():
            s = (await evaluate.batch_status(app, "capped")).to_json()
            settled = s["running"] == 0 and s["reserved"] < 1e-9
            return s if s["parked"] == "budget" and settled and s["parked_items"] else None

        status = await eventually(parked, timeout=90)
        spent, calls = await spend(app, "capped")
        assert spent == pytest.approx(status["spent"])
        assert spent <= budget + CONCURRENCY * worst
        assert 20 <= sum(calls.values()) < 40 and status["done"] == calls["call"]
        assert status["done"] + status["parked_items"] == 40 and status["failed"] == 0
        assert status["budget"] == budget and status["limits"] == {"rpm": 600}
        assert sim.stats()["calls"] == sum(calls.values())  # nothing sent past the budget
        assert await app.broker.list_jobs(status=JobStatus.DEAD) == []
        # Parking counts no attempt.
        jobs = await app.broker.list_jobs(status=JobStatus.PENDING)
        assert jobs and all(j.attempts == 0 for j in jobs)

        raised = await evaluate.set_budget(app, "capped", 100 * worst)
        assert raised["parked"] is None and raised["resumed"] > 0

        async def finished():
            # Done, and every call settled: a call's ledger row closes (and its cost joins
            # the batch's spent) once its answer is stored, a moment after it shows.
            s = (await evaluate.batch_status(app, "capped")).to_json()
            return s if s["done"] == 40 and s["running"] == 0 and s["reserved"] < 1e-9 else None

        final = await eventually(finished, timeout=90)
        assert final["parked_items"] == 0 and final["failed"] == 0
        spent, calls = await spend(app, "capped")
        assert calls == {"call": 40} and sim.stats()["calls"] == 40
        assert final["spent"] == pytest.approx(spent) and final["reserved"] < 1e-9
    finally:
        worker.stop(immediate=True)
        await run


async def test_a_budget_held_by_calls_in_flight_waits_for_them_instead_of_parking(app, sim):
    """A budget that holds one call's worst case at a time, with four workers: the other
    three wait for the first call to settle at its real cost (a tenth of the worst case
    here), then go on; the batch never parks while most of its budget is unspent (it
    parked with 0 % spent, seen on the dashboard)."""
    spec = EvalSpec(model="sim-budget", system="Rate it.", schema=SCHEMA,
                    params={"max_tokens": 2000})  # fmt: skip
    docs = documents(4)
    worst = max((sum(reservation_tokens(spec, t)) / 1000 for _, t in docs))
    await enqueue_documents(app, spec, "held", docs, budget=1.5 * worst)
    worker = Worker(app, queues=[evaluate.QUEUE], concurrency=4, poll_interval=0.05,
                    install_signal_handlers=False)  # fmt: skip
    run = asyncio.create_task(worker.run())
    try:

        async def ended():
            s = (await evaluate.batch_status(app, "held")).to_json()
            return s if s["done"] == 4 or s["parked"] else None

        status = await eventually(ended, timeout=90)
        assert status["parked"] is None and status["done"] == 4
        spent, calls = await spend(app, "held")
        assert calls == {"call": 4} and spent <= 1.5 * worst
    finally:
        worker.stop(immediate=True)
        await run


async def test_a_worker_that_stops_when_idle_stops_when_its_batch_parks(app, sim, caplog):
    """`herd worker --exit-when-idle` on a batch that runs out of budget: its jobs are
    held for years, not work to wait for; the worker stops and says why."""
    docs = documents(12)
    await enqueue_documents(app, SPEC, "stuck", docs, budget=3 * worst_case(docs[0][1]))
    worker = Worker(app, queues=[evaluate.QUEUE], concurrency=1, poll_interval=0.05,
                    stop_when_idle=True, install_signal_handlers=False)  # fmt: skip
    await asyncio.wait_for(worker.run(), 60)
    status = (await evaluate.batch_status(app, "stuck")).to_json()
    assert status["parked"] == "budget" and status["parked_items"] > 0
    assert "wait" in caplog.text and "parked batch" in caplog.text
    assert len(await app.broker.list_jobs(status=JobStatus.PENDING)) == status["parked_items"]


async def test_an_unpriced_model_with_a_budget_is_refused_not_called(app, sim):
    spec = EvalSpec(model="sim-unpriced", system="Rate it.", schema=SCHEMA)
    # Refused at submit, before anything is stored or enqueued.
    with pytest.raises(InvalidInput, match="sim-unpriced.*HERD_PRICES"):
        await enqueue_documents(app, spec, "blind", documents(1), budget=1.0)
    assert await app.list_jobs() == [] and sim.stats()["calls"] == 0
    # A batch given a budget after its jobs were enqueued: its job refuses to call.
    (r,) = await enqueue_documents(app, spec, "blind", documents(1))
    await evaluate.set_budget(app, "blind", 1.0)
    await Worker(app, queues=[evaluate.QUEUE], concurrency=1, poll_interval=0.05,
                 stop_when_idle=True, install_signal_handlers=False).run()  # fmt: skip
    job = await app.broker.get_job(r.job_id)
    assert job.status == JobStatus.DEAD and "sim-unpriced" in job.last_error
    assert "HERD_PRICES" in job.last_error and sim.stats()["calls"] == 0


async def test_a_call_left_open_by_a_dead_run_is_closed_cut_short_by_the_next(app, sim):
    (r,) = await enqueue_documents(app, SPEC, "killed", documents(1), budget=10.0)
    rt = await evaluate.EvalRuntime.of(app)
    # What a worker SIGKILLed mid-call leaves: its call opened, its reservation held.
    async with rt.store.transaction() as conn:
        await conn.execute(evaluate.ledger.Q["ledger_reserve"], {"b": "killed", "w": 0.5})
        await evaluate.ledger.open_call(conn, {"batch": "killed", "job": r.job_id, "key": "k",
                                               "model": SPEC.model, "provider": "openai",
                                               "i": 12, "w": 0.5})  # fmt: skip
    assert (await rt.store.batch("killed"))["reserved"] == 0.5
    await Worker(app, queues=[evaluate.QUEUE], concurrency=1, poll_interval=0.05,
                 stop_when_idle=True, install_signal_handlers=False).run()  # fmt: skip
    status = (await evaluate.batch_status(app, "killed")).to_json()
    assert status["done"] == 1
    assert status["ledger"]["cut_short"]["n"] == 1
    assert status["ledger"]["cut_short"]["input_tokens"] == 12
    spent, calls = await spend(app, "killed")
    assert calls == {"call": 1, "cut_short": 1}
    assert status["reserved"] < 1e-9 and status["spent"] == pytest.approx(spent)
    assert spent == pytest.approx(0.5 + status["ledger"]["call"]["cost"])


async def test_a_job_taken_over_from_a_dead_run_takes_its_key_lock_at_once(app, sim, pg_url):
    """The dead run held the key's singleflight lock (renewed up to its death, so its ttl
    still runs): the job's next run takes it over instead of waiting the ttl out."""
    (r,) = await enqueue_documents(app, SPEC, "taken", documents(1), budget=10.0)
    rt = await evaluate.EvalRuntime.of(app)
    key = (await app.get_job(r.job_id)).payload["key"]
    dead = PostgresLocks(pg_url, auto_migrate=False)
    async with dead:
        held = await dead.acquire(rt.cache._lock_name(key), ttl=300, owner=f"herd-job:{r.job_id}")
        assert held is not None
        worker = Worker(app, queues=[evaluate.QUEUE], concurrency=1, poll_interval=0.05,
                        stop_when_idle=True, install_signal_handlers=False)  # fmt: skip
        await asyncio.wait_for(worker.run(), 30)  # the ttl is 300 s
        assert ((await evaluate.batch_status(app, "taken")).to_json())["done"] == 1
        assert (await spend(app, "taken"))[1] == {"call": 1}
        assert not await dead.check(held) and not await dead.release(held)


def test_the_reservation_counts_the_max_tokens_asked_for():
    # herd.limits.tokens: never fewer than the provider counts, about 4 characters a token.
    assert reservation_tokens(SPEC, "x" * 10)[1] == 60
    assert reservation_tokens(SPEC, "x" * 10)[0] >= 5  # ceil(18 / 4)
    plain = EvalSpec(model="m", system="abc")
    assert reservation_tokens(plain, "", default_max=123)[1] == 123
