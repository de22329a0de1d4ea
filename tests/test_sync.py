"""app.sync: the producer verbs as blocking calls, from threads with and without a loop."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from herd import App, HerdError, JobStatus, Settings
from herd.app import App as AsyncApp
from herd.errors import InvalidInput
from herd.queue.base import DeadReason, Failure
from herd.queue.postgres import PostgresBroker
from herd.sync import SyncApp
from tests.conftest import ROOT

VERBS = [
    "enqueue",
    "enqueue_many",
    "get_job",
    "list_jobs",
    "dead_letters",
    "requeue",
    "purge_dead",
    "stats",
]


@pytest.fixture
def app(clean_pg, herd_home):
    the_app = App(settings=Settings(home=herd_home, database_url=clean_pg))
    yield the_app
    the_app.sync.close()


def herd_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "herd-sync"]


def kill_one(url: str) -> int:
    """Dead-letter the next job, as a worker would, through a broker of its own."""

    async def run() -> int:
        broker = PostgresBroker(url)
        await broker.open()
        try:
            (lease,) = await broker.claim(["default"], "w", 1)
            failure = Failure(lease, "boom", final=True, reason=DeadReason.MAX_ATTEMPTS)
            await broker.fail_if_leased(failure)
            return lease.job_id
        finally:
            await broker.close()

    return asyncio.run(run())


def test_every_verb_works_from_a_thread_without_a_loop(app, clean_pg):
    first = app.sync.enqueue("summarize", {"doc": "a.pdf"}, dedup_key="a.pdf", priority=5)
    again = app.sync.enqueue("summarize", {"doc": "a.pdf"}, dedup_key="a.pdf")
    assert first.created and not again.created and again.job_id == first.job_id
    many = app.sync.enqueue_many("summarize", [{"doc": f"{i}.pdf"} for i in range(3)])
    assert len({r.job_id for r in many}) == 3
    job = app.sync.get_job(first.job_id)
    assert job.payload == {"doc": "a.pdf"} and job.priority == 5
    listed = app.sync.list_jobs(status=JobStatus.PENDING)
    assert {j.id for j in listed} == {first.job_id, *(r.job_id for r in many)}
    (stats,) = app.sync.stats()
    assert stats.queue == "default" and stats.counts[JobStatus.PENDING] == 4

    dead = kill_one(clean_pg)  # the highest priority goes first: the a.pdf job
    assert [j.id for j in app.sync.dead_letters()] == [dead] == [first.job_id]
    assert app.sync.requeue([dead]).requeued == [dead]
    assert app.sync.get_job(dead).status == JobStatus.PENDING
    kill_one(clean_pg)
    assert app.sync.purge_dead(0.0) == 1 and app.sync.dead_letters() == []


def test_a_refused_input_raises_its_own_error(app):
    with pytest.raises(InvalidInput) as err:
        app.sync.enqueue("summarize", {}, priority=10**9)
    assert err.value.field == "priority"


def test_the_signatures_mirror_the_async_verbs():
    for name in VERBS:
        blocking = inspect.signature(getattr(SyncApp, name))
        awaited = inspect.signature(getattr(AsyncApp, name))
        assert blocking == awaited, name
        assert inspect.iscoroutinefunction(getattr(AsyncApp, name))
        assert not inspect.iscoroutinefunction(getattr(SyncApp, name))


def test_a_running_loop_does_not_deadlock(app):
    # A Jupyter cell: the caller's thread runs a loop and blocks it in the call.
    async def cell() -> int:
        return app.sync.enqueue("summarize", {"doc": "cell"}).job_id

    job_id = asyncio.run(cell())
    assert asyncio.run(cell()) != job_id  # a second loop, same facade: still works
    assert app.sync.get_job(job_id).payload == {"doc": "cell"}


def test_many_threads_at_first_use_share_one_open_app(app):
    barrier = threading.Barrier(16)

    def go(i: int) -> int:
        barrier.wait()
        return app.sync.enqueue("summarize", {"n": i}).job_id

    before = len(herd_threads())
    with ThreadPoolExecutor(16) as pool:
        ids = list(pool.map(go, range(16)))
    assert len(set(ids)) == 16
    assert len(herd_threads()) == before + 1  # one loop thread, one pool
    app.sync.close()
    assert len(herd_threads()) == before and app.loop is None
    assert app.sync.get_job(ids[0]).payload == {"n": 0}  # reopens after a close


async def test_an_app_opened_by_a_loop_is_used_on_that_loop(clean_pg, herd_home):
    # A worker's sync task enqueueing a follow-up: the App is open on the worker's loop.
    async with App(settings=Settings(home=herd_home, database_url=clean_pg)) as app:
        result = await asyncio.to_thread(app.sync.enqueue, "follow-up", {"n": 1})
        assert (await app.get_job(result.job_id)).payload == {"n": 1}
        assert herd_threads() == []  # no loop of its own: the App's loop did the work
        with pytest.raises(HerdError, match="await the async verb"):
            app.sync.enqueue("follow-up", {"n": 2})  # from that loop: refused, not hung


SCRIPT = """
import sys
from herd import App
app = App()
job = app.sync.enqueue("summarize", {"doc": "script"})
print(app.sync.get_job(job.job_id).status.value)
"""


def test_a_script_that_never_closes_exits_quietly(clean_pg, herd_home, tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
    env.update(HERD_HOME=str(herd_home), HERD_DATABASE_URL=clean_pg, PYTHONPATH=str(ROOT))
    r = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["pending"]
    assert r.stderr == "", r.stderr  # the pool was closed at exit, not destroyed pending
    with psycopg.connect(clean_pg) as conn:
        (n,) = conn.execute("SELECT count(*) FROM herd_jobs").fetchone()  # type: ignore[misc]
    assert n == 1
