"""Retention: what herd stores has a rule and a setting (HERD_FINISHED_TTL for finished jobs)."""

from __future__ import annotations

import json

import psycopg
import pytest
import redis.asyncio as aioredis

from herd import App
from herd.config import FINISHED_TTL, THROUGHPUT_TTL, Settings, parse_duration
from herd.errors import ConfigError, JobNotFound
from herd.queue.base import JobStatus
from herd.worker import Worker
from tests.conftest import flush_redis, truncate
from tests.helpers import eventually
from tests.test_cli import herd


def test_the_finished_ttl_setting():
    assert Settings.from_env({}).finished_ttl == FINISHED_TTL == 7 * 86400
    assert Settings.from_env({"HERD_FINISHED_TTL": "60"}).finished_ttl == 60
    assert Settings.from_env({"HERD_FINISHED_TTL": "0"}).finished_ttl == 0  # keep them
    for bad in ("-1", "1.5", "a week"):
        with pytest.raises(ConfigError, match="HERD_FINISHED_TTL"):
            Settings.from_env({"HERD_FINISHED_TTL": bad})


def test_the_throughput_ttl_setting():
    assert Settings.from_env({}).throughput_ttl == THROUGHPUT_TTL == 2 * 86400
    assert Settings.from_env({"HERD_THROUGHPUT_TTL": "3600"}).throughput_ttl == 3600
    assert Settings.from_env({"HERD_THROUGHPUT_TTL": "0"}).throughput_ttl == 0
    with pytest.raises(ConfigError, match="HERD_THROUGHPUT_TTL"):
        Settings.from_env({"HERD_THROUGHPUT_TTL": "2d"})


def test_durations():
    assert [parse_duration(t, "x") for t in ("30s", "15m", "12h", "7d", "2w", "90", " 7D ")] == [
        30, 900, 43200, 604800, 1209600, 90, 604800
    ]  # fmt: skip
    for bad in ("", "7x", "-1d", "1.5h", "d", "7 d", "1" * 10):
        with pytest.raises(ConfigError, match="--older-than must be a duration"):
            parse_duration(bad, "--older-than")


def test_dlq_purge_on_the_command_line(clean_pg):
    bad = herd("dlq", "purge", "--older-than", "a week", url=clean_pg)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "herd: error: --older-than must be a duration such as 30s, 15m, 12h, 7d or 2w, not 'a week'"
    ]
    with psycopg.connect(clean_pg, autocommit=True) as conn:
        for queue, age in (("a", "8 days"), ("a", "6 days"), ("b", "8 days")):
            conn.execute(
                "INSERT INTO herd_jobs (queue, task, payload, status, max_attempts, max_stalls,"
                " lease_seconds, finished_at) VALUES (%s, 't', '{}', 'dead', 1, 1, 1,"
                " now() - %s::interval)",
                (queue, age),
            )
    r = herd("dlq", "purge", "--older-than", "7d", "--queue", "a", "--json", url=clean_pg)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"purged": 1}
    r = herd("dlq", "purge", "--older-than", "7d", url=clean_pg)
    assert r.returncode == 0 and r.stdout.strip() == "purged 1 dead-lettered jobs"
    with psycopg.connect(clean_pg, autocommit=True) as conn:
        left = conn.execute("SELECT queue, finished_at > now() - interval '7 days' FROM herd_jobs")
        assert left.fetchall() == [("a", True)]


@pytest.mark.parametrize("backend", ["postgres", "redis"])
async def test_a_succeeded_job_goes_after_herd_finished_ttl(backend, request, herd_home):
    if backend == "postgres":
        url = request.getfixturevalue("pg_url")
        truncate(url)
        env = {"HERD_DATABASE_URL": url}
    else:
        url = request.getfixturevalue("redis_stack")
        flush_redis(url)
        env = {"HERD_REDIS_URL": url, "HERD_BROKER": "redis"}
    settings = Settings.from_env({"HERD_HOME": str(herd_home), "HERD_FINISHED_TTL": "1", **env})
    app = App(settings=settings)

    @app.task(name="noop")
    async def noop(payload):
        return payload

    async with app:
        job_id = (await app.enqueue("noop", {"n": 1})).job_id
        worker = Worker(app, poll_interval=0.1, install_signal_handlers=False, stop_when_idle=True)
        await worker.run()
        assert (await app.get_job(job_id)).status == JobStatus.SUCCEEDED

        async def gone() -> bool:
            # Both purge from the claim path now and then; call it as a worker would.
            await app.broker.purge_finished()
            try:
                await app.get_job(job_id)
            except JobNotFound:
                return True
            return False

        assert await eventually(gone, timeout=10), "the job outlived HERD_FINISHED_TTL=1"


@pytest.mark.parametrize("backend", ["postgres", "redis"])
async def test_workers_purge_on_their_own_as_often_as_a_short_ttl_needs(
    backend, request, herd_home
):
    # Retention rides on claiming: a fleet with a 1 s TTL must not keep a finished
    # job for the default 10 minutes between purges.
    if backend == "postgres":
        url = request.getfixturevalue("pg_url")
        truncate(url)
        env = {"HERD_DATABASE_URL": url}
    else:
        url = request.getfixturevalue("redis_stack")
        flush_redis(url)
        env = {"HERD_REDIS_URL": url, "HERD_BROKER": "redis"}
    settings = Settings.from_env({"HERD_HOME": str(herd_home), "HERD_FINISHED_TTL": "1", **env})
    app = App(settings=settings)

    @app.task(name="noop")
    async def noop(payload):
        return payload

    async with app:
        first = (await app.enqueue("noop", {"n": 1})).job_id
        await Worker(
            app, poll_interval=0.1, install_signal_handlers=False, stop_when_idle=True
        ).run()

        async def gone() -> bool:
            await app.broker.claim(["default"], "idle-worker", 1)  # nothing to claim
            if backend == "redis":
                # The hash expires by itself; its index entry goes only with a sweep.
                client = aioredis.Redis.from_url(url)
                async with client:
                    return await client.zscore("herd:{default}:st:succeeded", first) is None
            try:
                await app.get_job(first)
            except JobNotFound:
                return True
            return False

        assert await eventually(gone, timeout=15, interval=0.2)
