"""A batch's status read (herd eval status, GET /evals/{batch}, the dashboard's card)
costs O(active work), whatever the number of documents waiting: measured by what it
asks of the stores (rows its statements read from herd_eval_items, by EXPLAIN ANALYZE,
and the jobs it fetches), never by time. Both brokers: the items are in PostgreSQL,
the jobs in the broker's store."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from herd import App, Worker
from herd.llm import eval as evaluate
from herd.llm.eval import EvalRuntime, submit_texts
from herd.llm.eval.status import SWEEP
from herd.llm.eval.store import Q
from tests.conftest import flush_redis, truncate
from tests.helpers import priced
from tests.llm.conftest import clean_eval_tables
from tests.llm.test_batch_user import KEY, SPEC


@pytest.fixture(params=["postgres", "redis"])
async def app(request, pg_url, sim, monkeypatch, tmp_path):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    priced(monkeypatch, tmp_path, "sim-1")
    if request.param == "redis":
        redis_url = request.getfixturevalue("redis_stack")
        flush_redis(redis_url)
        monkeypatch.setenv("HERD_BROKER", "redis")
        monkeypatch.setenv("HERD_REDIS_URL", redis_url)
    truncate(pg_url)
    clean_eval_tables(pg_url)
    the_app = App(database_url=pg_url)
    the_app.task(name=evaluate.TASK, queue=evaluate.QUEUE, lease_seconds=5.0)(
        evaluate.task.evaluate
    )
    async with the_app:
        yield the_app


def _rows_read(plan: dict[str, Any], table: str) -> int:
    """Rows a plan (EXPLAIN ANALYZE, JSON) read from ``table``, filtered ones included."""
    own = 0
    if plan.get("Relation Name") == table:
        loops = plan.get("Actual Loops", 1)
        own = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
    return own + sum(_rows_read(p, table) for p in plan.get("Plans", []))


async def read_cost(app: App, batch: str, pg_url: str, monkeypatch) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """What one status read of ``batch`` asks: the jobs it fetches, and the rows of
    herd_eval_items its statements read (each replayed under EXPLAIN ANALYZE, rolled
    back)."""
    rt = await EvalRuntime.of(app)
    sent: list[tuple[str, Any]] = []
    fetched: list[int] = []
    execute, get_jobs, get_job = rt.store.execute, app.broker.get_jobs, app.broker.get_job

    async def spy_execute(query: str, params: Any = None) -> list[tuple[Any, ...]]:
        sent.append((Q.get(query, query), params))
        return await execute(query, params)

    async def spy_get_jobs(ids: Any) -> Any:
        fetched.extend(ids)
        return await get_jobs(ids)

    async def spy_get_job(job_id: int) -> Any:
        fetched.append(job_id)
        return await get_job(job_id)

    with monkeypatch.context() as m:
        m.setattr(rt.store, "execute", spy_execute)
        m.setattr(app.broker, "get_jobs", spy_get_jobs)
        m.setattr(app.broker, "get_job", spy_get_job)
        await evaluate.batch_status(app, batch)
    rows = 0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # Plans as a running store has them, its statistics kept by autovacuum: on a
        # table never analysed the planner may read 1,020 rows where an index reads none
        # (seen in .ci/run's fresh database).
        conn.execute("ANALYZE herd_eval_items")
    with psycopg.connect(pg_url) as conn:
        for sql, params in sent:
            ((plan,),) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchall()
            rows += _rows_read(plan[0]["Plan"], "herd_eval_items")
        conn.rollback()
    return {"jobs": len(fetched), "item_rows": rows, "statements": len(sent)}


def docs(batch: str, n: int) -> dict[str, str]:
    return {f"{batch}-{i:05d}.txt": f"Paper {batch} {i}.\nIt has results {i}.\n" for i in range(n)}


async def test_the_status_read_does_not_grow_with_the_documents_waiting(app, pg_url, monkeypatch):
    # No worker: every document waits. Both batches are past the sweep's tail.
    for batch, n in (("some", SWEEP + 20), ("many", 4 * SWEEP)):
        await submit_texts(app, SPEC, docs(batch, n), batch=batch)
    some = await read_cost(app, "some", pg_url, monkeypatch)
    many = await read_cost(app, "many", pg_url, monkeypatch)
    assert some == many
    # Before, it read each waiting item and fetched its job: 800 rows, 800 jobs.
    assert many["jobs"] == 0 and many["item_rows"] == 0
    status = await evaluate.batch_status(app, "many")
    assert (status.documents, status.queued, status.done, status.dead) == (
        4 * SWEEP,
        4 * SWEEP,
        0,
        0,
    )


async def test_a_job_dead_in_a_long_backlog_is_counted_without_the_sweep(app, sim, monkeypatch):
    rt = await EvalRuntime.of(app)
    backlog = await submit_texts(app, SPEC, docs("mixed", SWEEP + 10), batch="mixed")
    # Out of a worker's reach for an hour: nothing is ready but the one that fails, last
    # in path order, so that a sweep (of the first SWEEP) never looks at it.
    await app.broker.reschedule(backlog.job_ids, 3600)
    sim.script("invalid", "invalid")  # it answers outside the schema twice: dead
    (job_id,) = (await submit_texts(app, SPEC, {"zz.txt": "The odd one."}, batch="mixed")).job_ids
    worker = Worker(app, queues=[evaluate.QUEUE], concurrency=1, poll_interval=0.05,
                    stop_when_idle=True, install_signal_handlers=False)  # fmt: skip
    await worker.run()
    assert (await app.get_job(job_id)).status == "dead"
    status = await evaluate.batch_status(app, "mixed")
    assert (status.dead, status.lost, status.running) == (1, 0, 0)
    assert status.queued == SWEEP + 10
    (failure,) = status.failures
    assert failure["path"] == "zz.txt" and "schema" in failure["error"]
    # Requeued from the dead letters, it is waiting again, not dead.
    assert (await app.requeue([job_id])).requeued == [job_id]
    status = await evaluate.batch_status(app, "mixed")
    assert (status.dead, status.queued, status.failures) == (0, SWEEP + 11, [])
    ((recorded,),) = await rt.store.execute("SELECT count(*) FROM herd_eval_failures")
    assert recorded == 0


async def test_an_item_stored_after_its_job_ended_takes_its_answer_when_stored(app, sim):
    """The dedup race, closed where it happens: submit enqueues, a worker finishes the
    job, then submit stores the item; it is done at once, with no status read."""
    rt = await EvalRuntime.of(app)
    report = await submit_texts(app, SPEC, {"a.txt": "A paper."}, batch="first")
    worker = Worker(app, queues=[evaluate.QUEUE], concurrency=1, poll_interval=0.05,
                    stop_when_idle=True, install_signal_handlers=False)  # fmt: skip
    await worker.run()
    ((key, doc),) = await rt.store.execute("SELECT key, doc FROM herd_eval_items")
    # What enqueue_documents stores once enqueue_many returned the (finished) job.
    await rt.store.put_items("late", SPEC.hash, [("b.txt", key, report.job_ids[0], doc)])
    ((status, result),) = await rt.store.execute(
        "SELECT status, result FROM herd_eval_items WHERE batch = 'late'"
    )
    assert status == "done" and set(result["output"]) == {"score", "summary"}


async def test_the_counters_agree_with_the_items(app, sim, pg_url):
    await submit_texts(app, SPEC, docs("a", 5), batch="a")
    await submit_texts(app, SPEC, docs("b", 4), batch="b")
    worker = Worker(app, queues=[evaluate.QUEUE], concurrency=2, poll_interval=0.05,
                    stop_when_idle=True, install_signal_handlers=False)  # fmt: skip
    await worker.run()
    await submit_texts(app, SPEC, docs("c", 3), batch="c")
    await evaluate.cancel(app, "c")

    def counted() -> dict[tuple[str, str], int]:
        with psycopg.connect(pg_url) as conn:
            return {
                (b, s): int(n)
                for b, s, n in conn.execute(
                    "SELECT batch, status, sum(n) FROM herd_eval_item_counts GROUP BY 1, 2"
                    " HAVING sum(n) <> 0"
                )
            }

    def by_count() -> dict[tuple[str, str], int]:
        with psycopg.connect(pg_url) as conn:
            return {
                (b, s): int(n)
                for b, s, n in conn.execute(
                    "SELECT batch, status, count(*) FROM herd_eval_items GROUP BY 1, 2"
                )
            }

    assert counted() == by_count() == {("a", "done"): 5, ("b", "done"): 4, ("c", "cancelled"): 3}
