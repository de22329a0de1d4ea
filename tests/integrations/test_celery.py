"""A real Celery worker (two processes, Redis broker) whose task calls the model through
``herd.integrations.celery.once``: one model call per distinct prompt, and at most one
more when a worker is SIGKILLed mid-call."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from tests.helpers import eventually_sync
from tests.llm.conftest import Sim
from tests.llm.conftest import sim as sim  # noqa: F401 - the fixtures
from tests.llm.conftest import sim_server as sim_server  # noqa: F401

pytest.importorskip("celery")

from tests.integrations.celery_app import ANSWERS, QUEUE, app  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def broker(redis_stack):
    client = redis.Redis.from_url(redis_stack)
    client.delete(ANSWERS, QUEUE, "unacked", "unacked_index")
    yield redis_stack
    client.delete(ANSWERS, QUEUE, "unacked", "unacked_index")


def start_worker(name: str, broker: str, sim: Sim, pg_url: str, home: Path, log: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
    env.update(
        PYTHONPATH=str(ROOT), CELERY_TEST_BROKER=broker, CELERY_TEST_SIM=sim.openai_url,
        CELERY_TEST_VISIBILITY="2", HERD_DATABASE_URL=pg_url, HERD_HOME=str(home),
        HERD_EVAL_LOCK_TTL="3",  # a killed holder's lock frees itself soon
    )  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.integrations.celery_app", "worker",
         "--pool", "solo", "--concurrency", "1", "-Q", QUEUE, "-n", f"{name}@%h",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip


def answers(broker: str) -> dict[bytes, bytes]:
    return redis.Redis.from_url(broker).hgetall(ANSWERS)


def send(broker: str, prompts: list[str]) -> None:
    app.conf.broker_url = broker
    for i, prompt in enumerate(prompts):
        app.send_task("herd_celery_test.ask", args=[f"r{i}", prompt], queue=QUEUE)


@pytest.mark.timeout(120)
def test_twenty_tasks_with_five_prompts_make_five_model_calls(
    broker, sim, pg_url, herd_home, tmp_path
):
    sim.configure(latency=0.3)
    tag = uuid.uuid4().hex[:8]
    prompts = [f"question {i % 5} ({tag})" for i in range(20)]
    workers = [start_worker(f"w{i}", broker, sim, pg_url, herd_home, tmp_path / f"w{i}.log")
               for i in range(2)]  # fmt: skip
    try:
        send(broker, prompts)
        found = eventually_sync(lambda: len(answers(broker)) == 20 and answers(broker),
                                timeout=90, interval=0.2)  # fmt: skip
    finally:
        for w in workers:
            w.kill()
            w.wait(10)
    by_prompt: dict[str, set[bytes]] = {}
    for i, prompt in enumerate(prompts):
        by_prompt.setdefault(prompt, set()).add(found[f"r{i}".encode()])
    assert all(len(a) == 1 for a in by_prompt.values())  # one answer per prompt, shared
    assert sim.stats()["calls"] == 5, (tmp_path / "w0.log").read_text()[-2000:]


@pytest.mark.timeout(150)
def test_a_worker_killed_mid_call_costs_at_most_one_more_call(
    broker, sim, pg_url, herd_home, tmp_path
):
    sim.configure(latency=2.0)
    tag = uuid.uuid4().hex[:8]
    prompts = [f"slow question {i % 3} ({tag})" for i in range(6)]
    logs = [tmp_path / f"w{i}.log" for i in range(3)]
    workers = [start_worker(f"w{i}", broker, sim, pg_url, herd_home, logs[i]) for i in range(2)]
    try:
        send(broker, prompts)
        # Both workers are mid-call: kill one of them there.
        eventually_sync(lambda: sim.stats()["in_flight"] >= 2, timeout=60, interval=0.05)
        workers[0].kill()
        workers[0].wait(10)
        workers.append(start_worker("w2", broker, sim, pg_url, herd_home, logs[2]))
        eventually_sync(lambda: len(answers(broker)) == 6, timeout=120, interval=0.2)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait(10)
    stats = sim.stats()
    # The kill landed mid-call; three prompts, and that call paid again once at most.
    assert stats["disconnected"] >= 1, stats
    assert 3 <= stats["calls"] <= 4, stats
