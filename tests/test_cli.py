"""The `herd` command as a user runs it: exit codes, one-line errors, JSON output."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def herd(*args: str, url: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
    environ.update(env, PYTHONPATH=str(ROOT))
    if url:
        environ["HERD_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "herd", *args],
        capture_output=True,
        text=True,
        env=environ,
        timeout=60,
    )


def herd_version() -> str:
    import importlib.metadata

    # What pip installed, which must be what herd says it is.
    return importlib.metadata.version("herd")


def test_version_is_printed_without_touching_any_server():
    r = herd("--version", HERD_DATABASE_URL="postgresql://u:pw@127.0.0.1:1/nodb")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"herd {herd_version()}\n" and r.stderr == ""


def test_unreachable_database_is_one_clear_line_not_a_traceback():
    r = herd("jobs", "list", url="postgresql://herd:s3cret@127.0.0.1:1/nodb")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "unreachable" in lines[0] and "127.0.0.1:1" in lines[0]
    assert "s3cret" not in r.stderr and "Traceback" not in r.stderr


def test_payload_that_is_not_json_is_a_usage_error(clean_pg):
    r = herd("enqueue", "some.task", "{not json", url=clean_pg)
    assert r.returncode == 2
    assert "payload is not JSON" in r.stderr
    listed = herd("jobs", "list", "--json", url=clean_pg)
    assert listed.stdout == ""  # nothing was enqueued


def test_enqueue_list_show_dlq_requeue_round_trip(clean_pg):
    made = herd(
        "enqueue",
        "no.such.task",
        '{"doc": "a\'; DROP TABLE herd_jobs; --"}',
        "--json",
        url=clean_pg,
    )
    assert made.returncode == 0, made.stderr
    job_id = json.loads(made.stdout)["job_id"]
    ran = herd("worker", "--exit-when-idle", "--poll-interval", "0.1", url=clean_pg)
    assert ran.returncode == 0, ran.stderr
    dead = [
        json.loads(line) for line in herd("dlq", "list", "--json", url=clean_pg).stdout.splitlines()
    ]
    assert [d["id"] for d in dead] == [job_id]
    assert dead[0]["dead_reason"] == "unknown_task"
    assert dead[0]["payload"] == {"doc": "a'; DROP TABLE herd_jobs; --"}
    shown = json.loads(herd("jobs", "show", str(job_id), "--json", url=clean_pg).stdout)
    assert shown["status"] == "dead"
    requeued = herd("dlq", "requeue", str(job_id), url=clean_pg)
    assert requeued.returncode == 0 and f"requeued 1 job: {job_id}\n" == requeued.stdout
    again = herd("dlq", "requeue", str(job_id), url=clean_pg)
    assert again.returncode == 1 and "not in the dead-letter queue" in again.stderr
    stats = [
        json.loads(line)
        for line in herd("jobs", "stats", "--json", url=clean_pg).stdout.splitlines()
    ]
    assert stats[0]["counts"] == {"pending": 1}
    missing = herd("jobs", "show", "999999", url=clean_pg)
    assert missing.returncode == 1 and "no job has id 999999" in missing.stderr


def test_dlq_requeue_all_requeues_the_rest_and_names_each_job_left_dead(clean_pg):
    from herd.queue.postgres import PostgresBroker
    from tests.contract.test_requeue import dead
    from tests.helpers import job

    async def seed():
        broker = PostgresBroker(clean_pg)
        await broker.open()
        try:
            (held,) = await dead(broker, dedup_key="doc-7")
            plain = await dead(broker, n=2)
            (holder,) = await broker.enqueue([job(dedup_key="doc-7")])
            return held, plain, holder.job_id
        finally:
            await broker.close()

    held, plain, holder = asyncio.run(seed())
    r = herd("dlq", "requeue", "--all", url=clean_pg)
    assert r.returncode == 1
    assert f"requeued 2 jobs: {plain[0]}, {plain[1]}\n" == r.stdout
    assert r.stderr.strip().splitlines() == [
        f"herd: skipped job {held}: active job {holder} holds its dedup key 'doc-7'"
    ]
    r = herd("dlq", "requeue", str(held), "--json", url=clean_pg)
    assert r.returncode == 1 and json.loads(r.stdout) == {
        "requeued": [],
        "skipped": [{"job_id": held, "dedup_key": "doc-7", "held_by": holder}],
    }


def test_bad_job_fields_and_payloads_are_one_line_naming_the_field(clean_pg):
    deep = "[" * 300 + "]" * 300
    cases = [
        (["t", deep], {}, "payload is nested more than 64 levels deep"),
        (["t", '{"s": "nul \\u0000"}'], {}, "payload.s contains a NUL character"),
        (["t", "--priority", "99999999999"], {}, "priority is 99999999999; the limit"),
        (["t", "--dedup-key", ""], {}, "dedup_key is empty"),
        (["t", '"x"'], {"HERD_MAX_PAYLOAD_BYTES": "2"}, "the limit is 2 (HERD_MAX_PAYLOAD_BYTES)"),
    ]
    for args, env, says in cases:
        r = herd("enqueue", *args, url=clean_pg, **env)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1, (args, r.stderr)
        assert lines[0].startswith("herd: error: ") and says in lines[0], r.stderr
    # Bytes that are not UTF-8 in an argument reach Python as lone surrogates.
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
    environ.update(PYTHONPATH=str(ROOT), HERD_DATABASE_URL=clean_pg)
    r = subprocess.run(
        [sys.executable.encode(), b"-m", b"herd", b"enqueue", b"t\xff"],
        capture_output=True,
        env=environ,
        timeout=60,
    )
    assert r.returncode == 1 and b"task contains a lone surrogate" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert herd("jobs", "list", "--json", url=clean_pg).stdout == ""
    ok = herd("enqueue", "a\\u0000b", '{"s": "\\\\u0000"}', "--json", url=clean_pg)
    assert ok.returncode == 0, ok.stderr
    shown = herd("jobs", "show", str(json.loads(ok.stdout)["job_id"]), "--json", url=clean_pg)
    assert json.loads(shown.stdout)["task"] == "a\\u0000b"
    assert json.loads(shown.stdout)["payload"] == {"s": "\\u0000"}


def test_worker_with_an_app_that_cannot_be_imported_is_a_usage_error(clean_pg):
    r = herd("worker", "no_such_module:app", url=clean_pg)
    assert r.returncode == 2 and "cannot import 'no_such_module'" in r.stderr


def test_config_masks_secrets():
    r = herd(
        "config",
        "--json",
        HERD_DATABASE_URL="postgresql://u:hunter2@db/x",
        HERD_API_TOKEN="tok-secret",
        HERD_HOME="/tmp/h",
    )
    values = json.loads(r.stdout)
    assert values["version"] == herd_version()
    assert values["database_url"] == "postgresql://u:****@db/x"
    assert values["api_token"] == "****" and values["home"] == "/tmp/h"
    assert "hunter2" not in r.stdout and "tok-secret" not in r.stdout


def test_worker_waits_for_a_job_store_that_comes_up_after_it(tmp_path):
    # A fleet restarted together with its broker: workers that start first must
    # retry, not exit (the chaos run lost a worker this way to a Redis restart).
    from herd.testing.servers.redis_stack import RedisStackServer, _free_port
    from tests.conftest import CACHE

    port = _free_port()
    env = {"HERD_BROKER": "redis", "HERD_REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
    environ.update(env, PYTHONPATH=str(ROOT))
    worker = subprocess.Popen(
        [sys.executable, "-m", "herd", "worker", "--exit-when-idle", "--startup-wait", "60"],
        stderr=subprocess.PIPE,
        text=True,
        env=environ,
    )
    server = RedisStackServer(CACHE / "cache", tmp_path / "redis", port=port)
    try:
        assert worker.stderr is not None
        first = worker.stderr.readline()  # the first retry's warning: the worker is up, waiting
        assert "unreachable" in first and "retrying" in first, first
        server.start()
        _, rest = worker.communicate(timeout=60)
        assert worker.returncode == 0, first + rest
    finally:
        worker.kill()
        server.stop()


def test_worker_told_not_to_wait_fails_at_once_on_an_unreachable_store():
    r = herd(
        "worker",
        "--startup-wait",
        "0",
        HERD_BROKER="redis",
        HERD_REDIS_URL="redis://127.0.0.1:1/0",
    )
    assert r.returncode == 1
    assert r.stderr.startswith(
        "herd: error: Redis for the job store at redis://127.0.0.1:1/0 is unreachable"
    )
    assert "retrying" not in r.stderr


def test_eval_lock_ttl_is_a_setting_in_force_and_the_evaluations_lock_uses_it(pg_url):
    shown = herd("config", "--json", HERD_EVAL_LOCK_TTL="3")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["eval_lock_ttl"] == "3"
    refused = herd("config", HERD_EVAL_LOCK_TTL="0")
    assert refused.returncode == 2 and "HERD_EVAL_LOCK_TTL" in refused.stderr

    from herd import App
    from herd.config import Settings
    from herd.llm.eval import EvalRuntime

    async def lock_ttl() -> float:
        settings = Settings.from_env({"HERD_EVAL_LOCK_TTL": "3", "HERD_DATABASE_URL": pg_url})
        async with App(settings=settings) as app:
            return (await EvalRuntime.of(app)).cache.lock_ttl

    assert asyncio.run(lock_ttl()) == 3
