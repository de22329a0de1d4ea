"""OpenTelemetry: a request's trace continues in the worker through the job, on each broker.

Spans are collected by the SDK's tracer provider, set for each test that asks for
``spans`` and taken away after it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

from herd import App, Fatal, Worker, telemetry
from herd.errors import LeaseLost
from herd.llm import eval as evaluate
from herd.llm.eval import EvalSpec, batchapi, submit
from herd.queue.redis import RedisBroker
from tests.conftest import ROOT, flush_redis, truncate
from tests.helpers import eventually
from tests.llm.conftest import clean_eval_tables, sim, sim_server  # noqa: F401


class Collect(SpanProcessor):
    def __init__(self) -> None:
        self.on = False
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        if self.on:
            self.spans.append(span)


COLLECT = Collect()


@pytest.fixture
def spans():
    """The SDK's tracer provider, set for the test and taken away after it, as
    OpenTelemetry's own test utilities do (the API lets a process set one once): the
    rest of the suite runs as a default install does, with the API alone."""
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)
    provider = TracerProvider()
    provider.add_span_processor(COLLECT)
    trace.set_tracer_provider(provider)
    COLLECT.spans.clear()
    COLLECT.on = True
    try:
        yield COLLECT.spans
    finally:
        COLLECT.on = False
        COLLECT.spans.clear()
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = None
        telemetry._tracer.cache_clear()


@pytest.fixture(params=["postgres", "redis"])
async def app(request, pg_url):
    if request.param == "postgres":
        truncate(pg_url)
        the_app = App(database_url=pg_url)
    else:
        url = request.getfixturevalue("redis_stack")
        flush_redis(url)
        the_app = App(database_url=pg_url, broker=RedisBroker(url))
    async with the_app:
        yield the_app


async def drain(app: App, queues=("default",)) -> None:
    await Worker(app, queues=list(queues), poll_interval=0.05, stop_when_idle=True,
                 install_signal_handlers=False).run()  # fmt: skip


def named(spans, prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


async def test_a_request_trace_continues_in_the_worker(app, spans):
    tracer = trace.get_tracer("test")

    @app.task(name="greet")
    def greet(payload):  # sync: it runs in a thread, in its run's context still
        with tracer.start_as_current_span("inside the task"):
            return f"hello {payload['who']}"

    with tracer.start_as_current_span("POST /jobs", kind=SpanKind.SERVER) as request:
        r = await app.enqueue("greet", {"who": "ada"})
    stored = await app.get_job(r.job_id)
    assert stored.trace_context["traceparent"].split("-")[1] == format(
        request.get_span_context().trace_id, "032x"
    )
    await drain(app)

    (send,) = named(spans, "send ")
    (run,) = named(spans, "process ")
    (claim,) = named(spans, "receive ")
    trace_id = request.get_span_context().trace_id
    assert send.kind == SpanKind.PRODUCER and send.parent.span_id == request.context.span_id
    assert run.kind == SpanKind.CONSUMER and run.context.trace_id == trace_id
    assert run.parent.span_id == send.context.span_id
    (inside,) = named(spans, "inside the task")
    assert inside.parent.span_id == run.context.span_id
    job = await app.get_job(r.job_id)
    assert dict(run.attributes) == {
        "messaging.system": "herd",
        "messaging.destination.name": "default",
        "messaging.operation.type": "process",
        "messaging.operation.name": "run",
        "messaging.message.id": str(r.job_id),
        "messaging.client.id": job.last_worker,
        "herd.job.task": "greet",
        "herd.job.attempt": 1,
        "herd.job.stalls": 0,
        "herd.lease.token": job.lease_token,
        "herd.job.outcome": "succeeded",
    }
    assert send.attributes["messaging.message.id"] == str(r.job_id)
    assert run.status.status_code == StatusCode.UNSET
    # The claim is a trace of its own (a worker's round trip), linked to the job's.
    assert claim.kind == SpanKind.CLIENT and claim.context.trace_id != trace_id
    assert [link.context.span_id for link in claim.links] == [send.context.span_id]


async def test_one_claim_span_per_round_trip_and_errors_marked(app, spans):
    lost_once: list[int] = []

    # 2 s: the lost job is retaken once it runs out; the others must keep theirs under load.
    @app.task(name="work", max_attempts=1, lease_seconds=2.0)
    async def work(payload):
        if payload["n"] == 1:
            raise Fatal("bad input")
        if payload["n"] == 2 and not lost_once:
            lost_once.append(1)
            raise LeaseLost(job_id=0)  # a fenced write the store refused
        return payload["n"]

    results = await app.enqueue_many("work", [{"n": n} for n in range(3)])
    await drain(app)

    (send,) = named(spans, "send ")
    assert send.attributes["messaging.batch.message_count"] == 3
    first, again = sorted(named(spans, "receive "), key=lambda s: s.start_time)
    assert first.attributes["messaging.batch.message_count"] == 3 and len(first.links) == 3
    assert len(again.links) == 1  # the lost job, taken over once its lease expired
    runs = sorted(named(spans, "process "), key=lambda s: s.start_time)
    by_id = {}
    for s in runs:
        by_id.setdefault(s.attributes["messaging.message.id"], []).append(s)
    (ok,), (fatal,), (lost, retaken) = (by_id[str(r.job_id)] for r in results)
    assert {s.parent.span_id for s in runs} == {send.context.span_id}
    assert ok.attributes["herd.job.outcome"] == "succeeded"
    assert fatal.status.status_code == StatusCode.ERROR
    assert fatal.attributes["herd.job.outcome"] == "dead"
    assert fatal.attributes["error.type"] == "Fatal"
    assert [e.name for e in fatal.events] == ["exception"]
    assert lost.status.status_code == StatusCode.ERROR
    assert lost.attributes["herd.job.outcome"] == "lease_lost"
    assert [e.name for e in lost.events] == ["herd.lease_lost"]
    assert retaken.attributes["herd.job.stalls"] == 1
    assert retaken.attributes["herd.lease.token"] > lost.attributes["herd.lease.token"]
    assert retaken.attributes["herd.job.outcome"] == "succeeded"


async def test_an_oversized_trace_context_is_cut_to_its_traceparent(app, spans):
    @app.task(name="t")
    async def t(payload):
        return None

    state = trace.TraceState([(f"k{i}", "v" * 200) for i in range(20)])  # ~4 KB
    parent = trace.NonRecordingSpan(
        trace.SpanContext(0xABC, 0xDEF, True, trace.TraceFlags(1), trace_state=state)
    )
    with trace.use_span(parent):
        r = await app.enqueue("t")
    stored = (await app.get_job(r.job_id)).trace_context
    assert list(stored) == ["traceparent"] and format(0xABC, "032x") in stored["traceparent"]


# -- model calls


SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer"}, "summary": {"type": "string"}},
    "required": ["score", "summary"],
}
SPEC = EvalSpec(model="sim-otel", system="Rate it.", schema=SCHEMA)


@pytest.fixture
async def eval_app(pg_url, sim, monkeypatch, tmp_path):  # noqa: F811
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"sim-otel": {"input": 1000.0, "output": 2000.0}}))
    monkeypatch.setenv("HERD_PRICES", str(prices))
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET")
    truncate(pg_url)
    clean_eval_tables(pg_url)
    the_app = App(database_url=pg_url)
    the_app.task(name=evaluate.TASK, queue=evaluate.QUEUE)(evaluate.task.evaluate)
    async with the_app:
        yield the_app


async def test_model_call_spans_carry_tokens_cost_and_cache_source(eval_app, spans, tmp_path):
    doc = tmp_path / "paper.txt"
    doc.write_text("A paper about queues.")
    await submit(eval_app, [doc], SPEC, batch="first")
    await drain(eval_app, [evaluate.QUEUE])
    await submit(eval_app, [doc], SPEC, batch="second")  # answered by the exact cache
    await drain(eval_app, [evaluate.QUEUE])

    calls = named(spans, "chat sim-otel")
    assert [c.attributes["herd.cache.source"] for c in calls] == ["provider", "exact_cache"]
    called, served = calls
    runs = {s.context.span_id: s for s in named(spans, "process ")}
    assert called.parent.span_id in runs and served.parent.span_id in runs
    a = called.attributes
    assert called.kind == SpanKind.CLIENT
    assert a["gen_ai.provider.name"] == "openai" and a["gen_ai.request.model"] == "sim-otel"
    assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
    tokens_in, tokens_out = a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]
    expected = (tokens_in * 1000 + tokens_out * 2000) / 1e6  # USD per million tokens
    assert a["herd.cost_usd"] == pytest.approx(expected)
    rt = await evaluate.EvalRuntime.of(eval_app)
    ((ledger_cost,),) = await rt.store.execute(
        "SELECT cost::float8 FROM herd_eval_ledger WHERE kind = 'call'"
    )
    assert a["herd.cost_usd"] == pytest.approx(float(ledger_cost))
    assert served.attributes["herd.cost_usd"] == 0.0
    assert "gen_ai.usage.input_tokens" not in served.attributes


async def test_a_provider_batch_files_one_span_with_its_tokens_and_cost(
    eval_app,
    sim,  # noqa: F811
    spans,
    tmp_path,
):
    sim.configure(batch_latency=0.2)
    for name in (evaluate.spec.SUBMIT_TASK, evaluate.spec.POLL_TASK):
        fn = batchapi.batch_submit if name == evaluate.spec.SUBMIT_TASK else batchapi.batch_poll
        eval_app.task(name=name, queue=evaluate.QUEUE)(fn)
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(2):
        (folder / f"p{i}.txt").write_text(f"Paper {i}.")
    await submit(eval_app, [folder], SPEC, batch="b", batch_api=True)
    worker = Worker(eval_app, queues=[evaluate.QUEUE], poll_interval=0.05,
                    install_signal_handlers=False)  # fmt: skip
    running = asyncio.create_task(worker.run())

    async def filed():
        return named(spans, "chat ")

    try:
        await eventually(filed, timeout=30)
    finally:
        worker.stop()
        await running
    (span,) = named(spans, "chat sim-otel")
    a = span.attributes
    assert a["herd.cache.source"] == "batch" and a["herd.batch.requests"] == 2
    rt = await evaluate.EvalRuntime.of(eval_app)
    ((i, o, cost),) = await rt.store.execute(
        "SELECT sum(input_tokens), sum(output_tokens), sum(cost)::float8 FROM herd_eval_ledger"
        " WHERE kind = 'call'"
    )
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (i, o)
    assert a["herd.cost_usd"] == pytest.approx(float(cost))


# -- without the package


def test_without_opentelemetry_jobs_run_and_telemetry_is_off(clean_pg):
    script = textwrap.dedent(
        """
        import asyncio, sys
        sys.modules["opentelemetry"] = None  # as if the package were not installed
        from herd import App, Worker, telemetry

        async def main():
            async with App(database_url=sys.argv[1]) as app:
                app.task(name="double")(lambda payload: payload * 2)
                r = await app.enqueue("double", 21)
                await Worker(app, poll_interval=0.05, stop_when_idle=True,
                             install_signal_handlers=False).run()
                job = await app.get_job(r.job_id)
                print(telemetry.enabled(), job.result, job.trace_context,
                      any(m.startswith("opentelemetry.") for m in sys.modules))

        asyncio.run(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, clean_pg],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "42", "None", "False"]
    assert telemetry.enabled()  # here, with the package


def test_with_the_api_alone_a_jobs_context_is_passed_on_and_none_is_made(clean_pg):
    # No tracer provider is set in this process (the API's default): no span is made,
    # so a job enqueued outside any trace carries nothing; a job that came with a
    # context (from a producer with an SDK) passes it on to what its task enqueues.
    script = textwrap.dedent(
        """
        import asyncio, sys
        from herd import App, Worker
        from herd.queue.base import NewJob

        PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

        async def main():
            async with App(database_url=sys.argv[1]) as app:
                children = []

                @app.task(name="parent")
                async def parent(payload, ctx):
                    children.append((await ctx.app.enqueue("child")).job_id)

                app.task(name="child")(lambda payload: None)
                plain = await app.enqueue("child")
                await app.broker.enqueue(
                    [NewJob("parent", None, trace_context={"traceparent": PARENT})]
                )
                await Worker(app, poll_interval=0.05, stop_when_idle=True,
                             install_signal_handlers=False).run()
                print((await app.get_job(plain.job_id)).trace_context)
                print((await app.get_job(children[0])).trace_context["traceparent"])

        asyncio.run(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script, clean_pg],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    plain, child = out.stdout.split()
    assert plain == "None"
    assert child.split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
