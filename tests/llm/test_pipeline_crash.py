"""A pipeline under a SIGKILL: real `herd worker` processes, one killed while it holds a
piece's call; every document still gets exactly one reduce, made by one call."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from herd import App, JobStatus
from herd.config import Settings
from herd.llm import eval as evaluate
from herd.llm.eval import stages
from herd.llm.eval.pipeline import from_json
from herd.llm.eval.pipesubmit import submit_pipeline_texts
from herd.testing.fleet import Fleet, herd_worker, wait_until, worker_env
from tests.conftest import flush_redis, truncate
from tests.llm.conftest import SECRET, clean_eval_tables
from tests.llm.test_pipeline import NOTE, PIPE_TABLES, SUMMARY, manual

ROOT = Path(__file__).resolve().parents[2]
DOCS = 6
# Documents long enough that each one's reduce runs in more than one round: fewer of
# them, since each map piece is a call of a few tenths of a second.
ROUND_DOCS = 3

PIPE = {
    "stages": [
        {"name": "sections", "kind": "split", "by": "headings"},
        {"name": "notes", "kind": "map", "prompt": "Note it.", "schema": NOTE,
         "model": "sim-map"},
        {"name": "summary", "kind": "reduce", "prompt": "Sum up.", "schema": SUMMARY,
         "model": "sim-reduce"},
    ]
}  # fmt: skip


@pytest.fixture(params=["postgres", "redis"])
async def producer(request, pg_url, sim, monkeypatch):
    """The submitting app on each broker (the store, cache and ledger on PostgreSQL)."""
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    truncate(pg_url)
    clean_eval_tables(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {PIPE_TABLES}")
    settings = Settings(database_url=pg_url, broker=request.param)
    if request.param == "redis":
        url = request.getfixturevalue("redis_stack")
        flush_redis(url)
        settings = settings.override(redis_url=url)
    app = App(settings=settings)
    # The producer's registry gives the map jobs short leases: a killed holder's piece
    # is taken over in seconds.
    app.task(name=stages.STAGE_TASK, queue=evaluate.QUEUE, lease_seconds=5.0,
             max_attempts=3)(stages.run_stage)  # fmt: skip
    async with app:
        yield app


@pytest.mark.timeout(180)
async def test_a_worker_killed_mid_pipeline_leaves_one_reduce_per_document(
    producer, sim, pg_url, tmp_path
):
    sim.configure(latency=[0.3, 0.6])
    texts = {f"doc{d}.md": manual(f"Unit {d}", 4 + d) for d in range(DOCS)}
    maps = sum(5 + d for d in range(DOCS))
    await submit_pipeline_texts(producer, from_json(PIPE), texts, batch="chaos")
    settings = producer.settings
    env = worker_env(broker=settings.broker, database_url=pg_url, redis_url=settings.redis_url,
                     pythonpath=[ROOT], OPENAI_BASE_URL=sim.openai_url,
                     OPENAI_API_KEY=SECRET)  # fmt: skip
    argv = herd_worker("--queue", evaluate.QUEUE, "--concurrency", "2", "--poll-interval",
                       "0.1", "--grace", "5")  # fmt: skip

    async def held_by(pid: int) -> list:
        jobs = await producer.broker.list_jobs(status=JobStatus.PROCESSING, limit=1000)
        return [j for j in jobs if j.lease_owner and f":{pid}:" in j.lease_owner
                and j.task == stages.STAGE_TASK]  # fmt: skip

    def count(sql: str) -> int:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            row = conn.execute(sql).fetchone()
            return int(row[0]) if row else 0

    with Fleet(argv, env, logs=tmp_path, cwd=ROOT) as fleet:
        victim, _ = fleet.start(2)
        await wait_until(lambda: held_by(victim.pid), 60, what="a piece held by the victim")
        fleet.kill(victim.pid)
        fleet.start(1)

        async def all_done() -> bool:
            return (
                count(
                    "SELECT count(*) FROM herd_eval_items WHERE batch = 'chaos' AND status = 'done'"
                )
                == DOCS
            )

        await wait_until(all_done, 120, what="every document answered")
    # Exactly one reduce per document: one piece each, one call each at the provider.
    assert count("SELECT count(*) FROM herd_eval_pieces WHERE stage = 'summary'") == DOCS
    assert sim.stats()["by_model"]["sim-reduce"] == DOCS
    # Every map piece answered; calls beyond one per piece are the killed ones only.
    assert count("SELECT count(*) FROM herd_eval_pieces WHERE stage = 'notes'"
                 " AND status = 'done'") == maps  # fmt: skip
    assert count("SELECT min(open) FROM herd_eval_fanin") == 0
    assert maps <= sim.stats()["by_model"]["sim-map"] <= maps + 2


@pytest.mark.timeout(180)
async def test_a_worker_killed_mid_round_leaves_one_final_reduce_per_document(
    producer, sim, pg_url, tmp_path
):
    """The reduce's model has a small context: each document's reduce runs in rounds,
    and a worker is killed while it holds a reduce of a round."""
    sim.configure(latency=[0.3, 0.6])
    texts = {f"doc{d}.md": manual(f"Unit {d}", 12 + d) for d in range(ROUND_DOCS)}
    await submit_pipeline_texts(producer, from_json({**PIPE, "context": {"sim-reduce": 256}}),
                                texts, batch="rounds")  # fmt: skip
    settings = producer.settings
    env = worker_env(broker=settings.broker, database_url=pg_url, redis_url=settings.redis_url,
                     pythonpath=[ROOT], OPENAI_BASE_URL=sim.openai_url,
                     OPENAI_API_KEY=SECRET)  # fmt: skip
    argv = herd_worker("--queue", evaluate.QUEUE, "--concurrency", "2", "--poll-interval",
                       "0.1", "--grace", "5")  # fmt: skip

    async def reduce_held_by(pid: int) -> list:
        jobs = await producer.broker.list_jobs(status=JobStatus.PROCESSING, limit=1000)
        return [j for j in jobs if j.lease_owner and f":{pid}:" in j.lease_owner
                and j.task == stages.STAGE_TASK and j.payload["stage"] == "summary"]  # fmt: skip

    def rows(sql: str) -> list[tuple]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            return conn.execute(sql).fetchall()

    with Fleet(argv, env, logs=tmp_path, cwd=ROOT) as fleet:
        victim, _ = fleet.start(2)
        await wait_until(lambda: reduce_held_by(victim.pid), 90, what="a reduce held by the victim")
        fleet.kill(victim.pid)
        fleet.start(1)

        async def all_done() -> bool:
            done = "SELECT count(*) FROM herd_eval_items WHERE batch = 'rounds' AND status = 'done'"
            return rows(done)[0][0] == ROUND_DOCS

        await wait_until(all_done, 120, what="every document answered")
    # Per document: more than one round, and its last round is one piece.
    last = rows("SELECT path, max(round), count(*) FILTER (WHERE round = 1) FROM"
                " herd_eval_pieces WHERE stage = 'summary' GROUP BY path")  # fmt: skip
    assert len(last) == ROUND_DOCS and all(r > 1 and firsts > 1 for _, r, firsts in last)
    finals = rows("SELECT p.path, count(*) FROM herd_eval_pieces p JOIN (SELECT path,"
                  " max(round) AS r FROM herd_eval_pieces WHERE stage = 'summary' GROUP BY"
                  " path) m ON m.path = p.path AND p.round = m.r WHERE p.stage = 'summary'"
                  " GROUP BY p.path")  # fmt: skip
    assert sorted(n for _, n in finals) == [1] * ROUND_DOCS
    # Every round counted down to zero, every reduce piece answered; calls beyond one
    # per reduce piece are the killed ones only.
    (pieces,) = rows("SELECT count(*) FROM herd_eval_pieces WHERE stage = 'summary'"
                     " AND status = 'done'")[0]  # fmt: skip
    assert rows("SELECT count(*) FROM herd_eval_pieces WHERE stage = 'summary'")[0][0] == pieces
    assert rows("SELECT max(open) FROM herd_eval_fanin")[0][0] == 0
    assert pieces <= sim.stats()["by_model"]["sim-reduce"] <= pieces + 2
