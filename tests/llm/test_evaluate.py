"""Evaluation jobs end to end: real queue, real cache, the simulator as the provider."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from herd import App, JobStatus, Worker
from herd.config import EVAL_MAX_TOKENS, Settings
from herd.errors import HerdError, InvalidInput
from herd.llm import eval as evaluate
from herd.llm.eval import EvalRuntime, EvalSpec, results, submit
from tests.conftest import truncate
from tests.helpers import eventually
from tests.llm.conftest import clean_eval_tables

SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer"}, "summary": {"type": "string"}},
    "required": ["score", "summary"],
    "additionalProperties": False,
}
SPEC = EvalSpec(model="sim-1", system="Rate the paper from 1 to 10.", schema=SCHEMA)


@pytest.fixture
async def app(pg_url, sim, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET")
    truncate(pg_url)
    clean_eval_tables(pg_url)
    the_app = App(database_url=pg_url)
    # The built-in task with a lease a loaded machine's heartbeat keeps (the test of a
    # lost lease takes it over by its token, not by waiting it out).
    the_app.task(name=evaluate.TASK, queue=evaluate.QUEUE, lease_seconds=5.0, max_attempts=2)(
        evaluate.task.evaluate
    )
    async with the_app:
        yield the_app


async def run_until_idle(app: App) -> None:
    await Worker(app, queues=[evaluate.QUEUE], concurrency=4, poll_interval=0.05,
                 stop_when_idle=True, install_signal_handlers=False).run()  # fmt: skip


async def ledger(app: App) -> dict[str, int]:
    rt = await evaluate.EvalRuntime.of(app)
    rows = await rt.store.execute("SELECT kind, count(*) FROM herd_eval_ledger GROUP BY kind")
    return {k: n for k, n in rows}


async def test_each_unique_document_is_evaluated_once(app, sim, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Paper A.\nIt has results.\n")
    (docs / "a-crlf.txt").write_bytes(b"Paper A.  \r\nIt has results.\r\n\r\n")  # whitespace only
    (docs / "b.md").write_text("# Paper B\n\nDifferent content.\n")
    (docs / "broken.txt").write_bytes(b"valid start \xff\xfe then garbage")
    (docs / "empty.txt").write_text("   \n")
    report = await submit(app, [docs], SPEC)
    assert report.queued == 2 and report.deduplicated == 1
    assert len(report.errors) == 2
    assert any("broken.txt: not valid UTF-8 at byte 12 (line 1)" in e for e in report.errors)
    assert any("empty.txt: the document is empty" in e for e in report.errors)
    await run_until_idle(app)
    assert sim.stats()["calls"] == 2
    rt = await evaluate.EvalRuntime.of(app)
    items = await rt.store.execute("SELECT path, status, result FROM herd_eval_items ORDER BY path")
    assert [(p.rsplit("/", 1)[1], s) for p, s, _ in items] == [
        ("a-crlf.txt", "done"), ("a.txt", "done"), ("b.md", "done")]  # fmt: skip
    assert items[0][2]["output"] == items[1][2]["output"]
    assert set(items[2][2]["output"]) == {"score", "summary"}
    assert await ledger(app) == {"call": 2, "dedup": 1}

    # The same documents again: answered from the cache, no call.
    again = await submit(app, [docs / "a.txt", docs / "b.md"], SPEC, batch="second")
    await run_until_idle(app)
    assert again.queued == 2 and sim.stats()["calls"] == 2
    assert (await ledger(app))["cache"] == 2

    # A changed model, system prompt or schema is another question: it calls again.
    for changed in (
        EvalSpec(model="sim-2", system=SPEC.system, schema=SCHEMA),
        EvalSpec(model="sim-1", system="Rate it harshly.", schema=SCHEMA),
        EvalSpec(model="sim-1", system=SPEC.system, schema={**SCHEMA, "required": ["score"]}),
    ):
        await submit(app, [docs / "b.md"], changed)
    await run_until_idle(app)
    assert sim.stats()["calls"] == 5


async def test_malformed_output_is_repaired_once_then_dead_lettered_with_the_raw_text(
    app, sim, tmp_path
):
    doc = tmp_path / "p.txt"
    doc.write_text("A paper.")
    sim.script("malformed", "ok")
    await submit(app, [doc], SPEC, batch="repaired")
    await run_until_idle(app)
    rt = await evaluate.EvalRuntime.of(app)
    ((result,),) = await rt.store.execute("SELECT result FROM herd_eval_items")
    assert result["repaired"] is True and set(result["output"]) == {"score", "summary"}
    assert sim.stats()["calls"] == 2

    doc2 = tmp_path / "q.txt"
    doc2.write_text("Another paper.")
    sim.script("schema_invalid", "schema_invalid")
    report = await submit(app, [doc2], SPEC, batch="broken")
    await run_until_idle(app)
    job = await app.get_job(report.job_ids[0])
    assert job.status == JobStatus.DEAD and job.dead_reason == "fatal"
    assert "does not match the schema" in job.last_error and "raw output:" in job.last_error
    assert sim.stats()["calls"] == 4  # one call and one repair; no retry of a Fatal


async def test_losing_the_lease_mid_call_aborts_the_request_and_writes_nothing(
    app, sim, tmp_path, pg_url
):
    doc = tmp_path / "slow.txt"
    doc.write_text("A paper that takes the model a long time.")
    sim.configure(latency=30)
    report = await submit(app, [doc], SPEC)
    worker = Worker(app, queues=[evaluate.QUEUE], concurrency=2, poll_interval=0.05,
                    install_signal_handlers=False)  # fmt: skip
    run = asyncio.create_task(worker.run())
    await sim.wait_for(lambda s: s["calls"] == 1, timeout=10)
    with psycopg.connect(pg_url, autocommit=True) as conn:  # another worker takes it over
        conn.execute(
            "UPDATE herd_jobs SET lease_token = lease_token + 1, lease_owner = 'thief',"
            " lease_expires_at = now() + interval '60 seconds'"
        )
    await sim.wait_for(lambda s: s["disconnected"] >= 1, timeout=10)
    await eventually(lambda: asyncio.sleep(0, worker.stats.lost == 1), timeout=10)
    worker.stop()
    await run
    rt = await evaluate.EvalRuntime.of(app)
    assert await ledger(app) == {"lost": 1}
    ((status, result),) = await rt.store.execute("SELECT status, result FROM herd_eval_items")
    assert (status, result) == ("queued", None)
    job = await app.get_job(report.job_ids[0])
    assert job.lease_owner == "thief" and job.result is None
    assert await rt.cache.get(job.payload["key"]) is None


async def test_a_document_deduplicated_onto_a_finished_job_is_settled_from_it(app, sim, tmp_path):
    from herd.llm.eval import batch_status

    doc = tmp_path / "a.txt"
    doc.write_text("A paper.")
    report = await submit(app, [doc], SPEC, batch="first")
    await run_until_idle(app)
    # As when submit() adds its item just after the job updated its items and finished.
    rt = await evaluate.EvalRuntime.of(app)
    await rt.store.execute(
        "INSERT INTO herd_eval_items (batch, path, key, job_id) SELECT 'late', 'b.txt', key,"
        " job_id FROM herd_eval_items WHERE batch = 'first' AND job_id = %s",
        (report.job_ids[0],),
    )
    status = (await batch_status(app, "late")).to_json()
    assert (status["documents"], status["done"]) == (1, 1)
    ((result,),) = await rt.store.execute("SELECT result FROM herd_eval_items WHERE batch = 'late'")
    assert set(result["output"]) == {"score", "summary"}


async def test_a_cache_that_cannot_open_leaves_no_pool_open(pg_url):
    def connections() -> int:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            ).fetchone()
            return int(row[0])

    other = App(database_url=pg_url)
    # A port nothing listens on: the Redis cache fails after the evaluation store opened.
    other.settings = other.settings.override(cache="redis", redis_url="redis://127.0.0.1:9/0")
    async with other:
        before = connections()
        with pytest.raises(HerdError):
            await EvalRuntime.of(other)
        assert connections() == before


# -- params that would change the price or the fan-out of a call

REFUSED_PARAMS = [
    ({"model": "gpt-4-32k"}, "params.model"),
    ({"messages": [{"role": "user", "content": "x"}]}, "params.messages"),
    ({"system": "Be generous."}, "params.system"),
    ({"stream": True}, "params.stream"),
    ({"stream_options": {"include_usage": True}}, "params.stream_options"),
    ({"service_tier": "priority"}, "params.service_tier"),
    ({"n": 5}, "params.n"),
    ({"n": True}, "params.n"),
    ({"best_of": 3}, "params.best_of"),
    ({"max_tokens": 0}, "params.max_tokens"),
    ({"max_tokens": "lots"}, "params.max_tokens"),
    ({"max_completion_tokens": -1}, "params.max_completion_tokens"),
    # Billed work beyond the answer's tokens (issue 29, item 20).
    ({"web_search_options": {}}, "params.web_search_options"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "params.tools"),
    ({"tools": [{"type": "code_execution_20250522", "name": "code_execution"}]}, "params.tools"),
    ({"modalities": ["text", "audio"]}, "params.modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "params.audio"),
    # An allow-list: what herd does not know is refused too.
    ({"some_future_billed_option": True}, "params.some_future_billed_option"),
]


@pytest.mark.parametrize(
    ("params", "field"), REFUSED_PARAMS, ids=[f"{f}-{i}" for i, (_, f) in enumerate(REFUSED_PARAMS)]
)
def test_a_spec_refuses_params_that_change_price_or_fan_out(params, field):
    with pytest.raises(InvalidInput) as caught:
        EvalSpec(model="sim-1", system="s", params=params)
    assert caught.value.field == field and str(caught.value).startswith(field)


def test_harmless_params_and_a_single_answer_are_accepted():
    EvalSpec(model="sim-1", system="s", params={"temperature": 0, "seed": 7, "n": 1, "best_of": 1})
    EvalSpec(model="sim-1", system="s", params={"top_p": 0.9, "top_k": 5, "stop": ["\n"],
             "stop_sequences": ["END"], "presence_penalty": 0.1, "frequency_penalty": 0.1,
             "logit_bias": {"50256": -100}, "user": "u1"})  # fmt: skip
    spec = EvalSpec(model="sim-1", system="s", params={"max_tokens": EVAL_MAX_TOKENS})
    spec.check(Settings())  # the default bound is inclusive


async def test_max_tokens_is_bounded_by_the_setting_before_anything_is_enqueued(app, tmp_path):
    doc = tmp_path / "a.txt"
    doc.write_text("A paper.")
    over = EvalSpec(model="sim-1", system="s", params={"max_tokens": EVAL_MAX_TOKENS + 1})
    with pytest.raises(InvalidInput, match=r"params.max_tokens is 16385; the limit is 16384"):
        await submit(app, [doc], over)
    app.settings = app.settings.override(eval_max_tokens=100)
    lower = EvalSpec(model="sim-1", system="s", params={"max_completion_tokens": 101})
    with pytest.raises(InvalidInput, match="HERD_EVAL_MAX_TOKENS") as caught:
        await evaluate.enqueue_documents(app, lower, "b", [("a.txt", "A paper.")])
    assert caught.value.field == "params.max_completion_tokens"
    assert await app.list_jobs() == []


async def test_a_job_enqueued_under_a_higher_limit_is_dead_lettered_not_called(app, sim, tmp_path):
    doc = tmp_path / "a.txt"
    doc.write_text("A paper.")
    spec = EvalSpec(model="sim-1", system="s", schema=SCHEMA, params={"max_tokens": 500})
    report = await submit(app, [doc], spec)
    app.settings = app.settings.override(eval_max_tokens=100)  # the workers' setting
    await run_until_idle(app)
    job = await app.get_job(report.job_ids[0])
    assert job.status == JobStatus.DEAD and job.dead_reason == "fatal"
    assert "params.max_tokens is 500; the limit is 100" in job.last_error
    assert sim.stats()["calls"] == 0


def test_the_cli_refuses_such_params_as_a_usage_error(tmp_path):
    from tests.test_cli import herd

    doc, prompt = tmp_path / "a.txt", tmp_path / "prompt.txt"
    doc.write_text("A paper.")
    prompt.write_text("Rate it.")
    base = ("eval", "submit", str(doc), "--prompt", str(prompt), "--model", "sim-1")
    # Refused before any store is reached: no database is configured or started here.
    url = "postgresql://herd@127.0.0.1:9/none"
    for params, field, env in (
        ('{"model": "gpt-4-32k"}', "params.model", {}),
        ('{"n": 4}', "params.n", {}),
        ('{"max_tokens": 101}', "params.max_tokens", {"HERD_EVAL_MAX_TOKENS": "100"}),
    ):
        r = herd(*base, "--params", params, url=url, COLUMNS="200", **env)
        assert r.returncode == 2, r.stderr
        assert field in r.stderr and "--params" in r.stderr and "Traceback" not in r.stderr


async def test_the_http_api_answers_422_naming_the_param(app):
    from tests.api.conftest import client_of

    body = {"model": "sim-1", "system": "s", "documents": [{"name": "a", "text": "A paper."}]}
    async with client_of(app) as c:
        for params, field in (
            ({"model": "gpt-4-32k"}, "params.model"),
            ({"best_of": 2}, "params.best_of"),
            ({"max_tokens": EVAL_MAX_TOKENS + 1}, "params.max_tokens"),
        ):
            r = await c.post("/evals", json={**body, "params": params})
            assert r.status_code == 422, r.text
            assert field in r.text
            if "max_tokens" in field:
                assert str(EVAL_MAX_TOKENS) in r.text
    assert await app.list_jobs() == []


# -- the server asked is part of the exact cache's key (issue 29, item 19)


async def test_two_servers_behind_one_model_name_do_not_share_answers(
    app, sim, tmp_path, monkeypatch
):
    doc = tmp_path / "a.txt"
    doc.write_text("Paper A.\nIt has results.\n")
    await submit(app, [doc], SPEC, batch="first-server")
    await run_until_idle(app)
    assert sim.stats()["calls"] == 1
    # Another server serving "sim-1" (the simulator's unversioned routes): its own answer.
    monkeypatch.setenv("OPENAI_BASE_URL", sim.url)
    other = await submit(app, [doc], SPEC, batch="second-server")
    await run_until_idle(app)
    assert sim.stats()["calls"] == 2 and other.queued == 1
    # The same server named with a trailing slash: the same endpoint, answered by the cache.
    monkeypatch.setenv("OPENAI_BASE_URL", sim.url + "/")
    await submit(app, [doc], SPEC, batch="same-server")
    await run_until_idle(app)
    assert sim.stats()["calls"] == 2
    rt = await EvalRuntime.of(app)
    rows = await rt.store.execute("SELECT batch, source FROM herd_eval_items ORDER BY batch")
    assert rows == [("first-server", "computed"), ("same-server", "hit"),
                    ("second-server", "computed")]  # fmt: skip


def test_the_default_public_endpoint_keeps_the_keys_cached_before(monkeypatch):
    from herd.cache import canonical_key

    text = "Paper A."
    before = canonical_key(model="openai:sim-1", system=SPEC.system, schema=SCHEMA, params={},
                           document=text)  # fmt: skip
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert SPEC.key(text) == before
    monkeypatch.setenv("OPENAI_BASE_URL", "https://API.openai.com:443/v1/")
    assert SPEC.key(text) == before
    monkeypatch.setenv("OPENAI_BASE_URL", "http://10.0.0.7:8000/v1")
    assert SPEC.key(text) != before
    anthropic = EvalSpec(model="sim-1", provider="anthropic", system="s")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://10.0.0.7:8000")
    assert anthropic.key(text) != SPEC.key(text)
    moved = anthropic.key(text)
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    assert anthropic.key(text) != moved


async def test_without_a_schema_the_models_text_is_the_answer(app, sim, tmp_path):
    """A prompt and no schema: nothing asks the model for JSON, so its prose is the
    answer, paid once; not a failure that is paid again and dead-lettered."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("Paper A measures the boiling point of water.\n")
    sim.configure(content="fixed", fixed_text="Rigour: 4 of 5. The method is sound.")
    spec = EvalSpec(model="sim-1", system="Rate the paper's rigour from 1 to 5.")
    report = await submit(app, [docs], spec, batch="prose")
    await run_until_idle(app)
    status = (await evaluate.batch_status(app, "prose")).to_json()
    assert (status["done"], status["dead"]) == (1, 0), status
    (row,) = [r async for r in results.rows(app, "prose")]
    assert row["output"] == "Rigour: 4 of 5. The method is sound.", row
    assert sim.stats()["calls"] == 1 and report.queued == 1


async def test_an_answer_is_stored_before_its_call_is_closed_and_outlives_a_dropped_store(
    app, sim, tmp_path, pg_url
):
    """The exact cache's write of a paid answer is held up (another session's uncommitted
    row on its key), then its connection is cut. The ledger row stays open until the answer
    is stored: a run that died here would leave it to be closed 'cut_short' by the run that
    takes over, which finds the answer, instead of a closed call whose answer is lost and
    paid again. The cut write is retried on a new connection: one call in all."""
    doc = tmp_path / "a.txt"
    doc.write_text("A paper whose answer must not be paid twice.")
    report = await submit(app, [doc], SPEC)
    job = await app.get_job(report.job_ids[0])
    rt = await evaluate.EvalRuntime.of(app)
    blocker = psycopg.connect(pg_url)
    blocker.execute(
        "INSERT INTO herd_cache (namespace, key, value) VALUES (%s, %s, '{}')",
        (rt.cache.namespace, job.payload["key"]),
    )
    waiting = (
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND query LIKE '%%INSERT INTO herd_cache %%' AND pid <> %s"
    )
    worker = Worker(app, queues=[evaluate.QUEUE], concurrency=1, poll_interval=0.05,
                    install_signal_handlers=False)  # fmt: skip
    run = asyncio.create_task(worker.run())
    try:
        with psycopg.connect(pg_url, autocommit=True) as watch:
            me = blocker.info.backend_pid

            async def put_waits() -> list[tuple[int]]:
                return watch.execute(waiting, (me,)).fetchall()

            (pid,), *_ = await eventually(put_waits, timeout=20)
            states = watch.execute("SELECT state FROM herd_eval_ledger").fetchall()
            assert states == [("open",)]  # paid, answered, and not closed before it is stored
            watch.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await eventually(put_waits, timeout=20)  # retried on another connection
            blocker.rollback()
            await eventually(lambda: asyncio.sleep(0, worker.stats.succeeded == 1), timeout=20)
    finally:
        blocker.close()
        worker.stop()
        await run
    assert sim.stats()["calls"] == 1
    assert await ledger(app) == {"call": 1}
    assert (await rt.cache.get(job.payload["key"]))["output"] is not None
