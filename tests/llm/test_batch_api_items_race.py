"""A batch-submit job a worker runs before its chunk's items are stored (submit enqueues
the job, then inserts the items) is retried, not dead-lettered: found by
bench/eval_cost.py, where one wave's documents were never evaluated."""

from __future__ import annotations

import asyncio
import hashlib

import psycopg

from herd import App, Worker
from herd.llm import eval as evaluate
from herd.llm.eval import EvalRuntime
from tests.helpers import eventually
from tests.llm.test_batch_api import SPEC, all_done, app  # noqa: F401 - the fixture

TEXT = "Paper 0.\nIt has results number 0.\n"


async def test_a_submit_job_run_before_its_items_are_stored_is_retried(app: App, sim, pg_url):  # noqa: F811
    rt = await EvalRuntime.of(app)
    key, doc = SPEC.key(TEXT), hashlib.sha256(TEXT.encode()).hexdigest()
    # What enqueue_batch_documents stores before it enqueues the chunk's job.
    await rt.store.put_batch("b1", budget=None, limits=None)
    await rt.store.put_spec(SPEC)
    await rt.store.put_documents({doc: TEXT})
    job = await app.enqueue(
        evaluate.spec.SUBMIT_TASK,
        {"batch": "b1", "spec": SPEC.hash, "chunk": "c1", "keys": [key]},
        queue=evaluate.QUEUE,
    )
    worker = Worker(app, queues=[evaluate.QUEUE], concurrency=2, poll_interval=0.05,
                    install_signal_handlers=False)  # fmt: skip
    running = asyncio.create_task(worker.run())
    try:

        async def ran_once() -> tuple[str, int] | None:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT status, attempts FROM herd_jobs WHERE id = %s", (job.job_id,)
                ).fetchone()
            return row if row and (row[1] >= 1 or row[0] == "dead") else None

        status, _ = await eventually(ran_once, timeout=15, interval=0.05)
        assert status != "dead", "the job ran before its items were stored and was dead-lettered"
        # The items land (as enqueue_batch_documents inserts them) and the retry finds them.
        await rt.store.execute(
            "INSERT INTO herd_eval_items (batch, path, key, job_id, doc, spec)"
            " VALUES ('b1', 'p0.txt', %s, %s, %s, %s)",
            (key, job.job_id, doc, SPEC.hash),
        )
        await eventually(lambda: all_done(app, 1), timeout=30, interval=0.1)
    finally:
        worker.stop()
        await running
    stats = sim.stats()
    assert stats["batches"]["created"] == 1 and stats["batch_billed"] == 1
