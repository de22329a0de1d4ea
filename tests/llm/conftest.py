"""A real simulator process for the LLM tests: started once, reset before each test.

No HTTP is mocked: the providers talk to ``python -m herd.testing.simulator`` over TCP,
and the tests read what the server saw from ``GET /_sim/stats``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from herd import Worker
from herd.llm.eval import QUEUE
from herd.testing.simulator import SimulatorProcess
from tests.helpers import eventually

SECRET = "sk-test-SECRET"


class Sim:
    """The control side of a running simulator."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.openai_url = url + "/v1"  # OpenAI-style base URLs carry the version
        self.http = httpx.Client(base_url=url, timeout=10)

    def configure(self, **changes: Any) -> dict[str, Any]:
        response = self.http.post("/_sim/config", json=changes)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def script(self, *outcomes: str) -> None:
        self.configure(script=list(outcomes))

    def reset(self) -> None:
        self.http.post("/_sim/reset").raise_for_status()

    def stats(self) -> dict[str, Any]:
        return dict(self.http.get("/_sim/stats").json())

    async def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 5.0
    ) -> dict[str, Any]:
        """Poll the stats (without blocking the event loop) until ``predicate`` holds."""
        deadline = time.monotonic() + timeout
        while True:
            stats = await asyncio.to_thread(self.stats)
            if predicate(stats):
                return stats
            if time.monotonic() > deadline:
                raise AssertionError(f"simulator stats never matched within {timeout} s: {stats}")
            await asyncio.sleep(0.02)


@pytest.fixture(scope="session")
def sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    log = tmp_path_factory.mktemp("sim") / "simulator.log"
    with SimulatorProcess(log=log) as proc:
        sim = Sim(proc.url)
        try:
            yield sim
        finally:
            sim.http.close()


@pytest.fixture
def sim(sim_server: Sim) -> Sim:
    """The simulator with fresh counters and its start-up behaviour."""
    sim_server.reset()
    return sim_server


EVAL_TABLES = (
    "herd_eval_items, herd_eval_ledger, herd_eval_documents, herd_eval_specs,"
    " herd_eval_ledger_totals, herd_eval_batch_totals, herd_eval_keys, herd_cache,"
    " herd_cache_stats, herd_eval_batches, herd_eval_provider_batches, herd_eval_failures,"
    " herd_eval_job_answers, herd_eval_batch_specs, herd_eval_item_counts, herd_eval_batch_keys,"
    " herd_eval_stage_costs"
)


def clean_eval_tables(url: str) -> None:
    """Empty the evaluation tables and the exact cache, their migrations applied first
    (the stores migrate on first use, which may come after this)."""
    import psycopg

    from herd.db.postgres import migrate

    async def migrated() -> None:
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
        async with conn:
            for package in ("herd.queue.sql", "herd.llm.sql", "herd.cache.sql"):
                await migrate(conn, package)

    with ThreadPoolExecutor(1) as pool:  # the caller may already run an event loop
        pool.submit(asyncio.run, migrated()).result()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {EVAL_TABLES}")


async def run_until(app, probe, *, concurrency: int = 1):  # type: ignore[no-untyped-def]
    """Run an evaluation worker until ``probe`` holds (a parked batch's jobs stay queued,
    so a worker that stops when idle would never stop)."""
    worker = Worker(app, queues=[QUEUE], concurrency=concurrency, poll_interval=0.05,
                    install_signal_handlers=False)  # fmt: skip
    run = asyncio.create_task(worker.run())
    try:
        return await eventually(probe, timeout=20)
    finally:
        worker.stop(immediate=True)
        await run
