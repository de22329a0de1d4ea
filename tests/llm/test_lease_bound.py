"""A model call does not outlive its job's hold, even when the task drops a cancellation.

On Python 3.11 a cancellation can be dropped: ``asyncio.wait_for`` (inside
psycopg_pool's getconn, among others) returns its result and swallows a cancellation
that lands in the same loop iteration (gh-86296; herd.aio.stop). A task whose
cancellation was dropped goes on, to its model call if that is next. The worker
cancels it again until it ends, so the call is cut at once rather than run for as long
as the provider keeps it (the read timeout, 300 s), while the heartbeat, still running,
renews the job's lease and holds it from every other worker.
"""

from __future__ import annotations

import asyncio

import pytest

from herd import App, JobStatus, Worker
from herd.llm import OpenAICompatible
from tests.llm.conftest import SECRET, Sim


@pytest.mark.timeout(90)
async def test_a_model_call_after_a_dropped_cancellation_does_not_hold_the_shutdown(
    clean_pg: str, sim: Sim
) -> None:
    sim.configure(latency=60)  # the answer is held far past the lease and the test
    started, dropped, cut = asyncio.Event(), asyncio.Event(), asyncio.Event()
    app = App(database_url=clean_pg)
    llm = OpenAICompatible(sim.openai_url, SECRET, model="gpt-4o")

    @app.task(name="call", lease_seconds=3.0, max_attempts=1)
    async def call(payload: dict[str, object]) -> str:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            dropped.set()  # swallowed, as asyncio.wait_for does on 3.11
        try:
            done = await llm.complete("s", "a long document")
        except asyncio.CancelledError:
            cut.set()
            raise
        return done.text

    try:
        async with app:
            r = await app.enqueue("call")
            worker = Worker(app, concurrency=1, poll_interval=0.1, install_signal_handlers=False)
            run = asyncio.create_task(worker.run())
            await asyncio.wait_for(started.wait(), 30)
            worker.stop(immediate=True)  # a second SIGTERM: running jobs released now
            # The shutdown ends in seconds, not when the simulator answers (60 s).
            await asyncio.wait_for(run, 30)
            assert dropped.is_set() and cut.is_set()
            stats = await sim.wait_for(lambda s: s["in_flight"] == 0, 30)
            assert stats["by_status"] == {}  # never answered: hung up
            job = await app.get_job(r.job_id)
            assert job.status == JobStatus.PENDING and job.attempts == 0  # handed back
    finally:
        await llm.aclose()
