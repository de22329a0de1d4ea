"""Retention: what herd stores has a rule and a setting (HERD_FINISHED_TTL for finished jobs)."""

from __future__ import annotations

import pytest

from herd import App
from herd.config import FINISHED_TTL, Settings
from herd.errors import ConfigError, JobNotFound
from herd.queue.base import JobStatus
from herd.worker import Worker
from tests.conftest import flush_redis, truncate
from tests.helpers import eventually


def test_the_finished_ttl_setting():
    assert Settings.from_env({}).finished_ttl == FINISHED_TTL == 7 * 86400
    assert Settings.from_env({"HERD_FINISHED_TTL": "60"}).finished_ttl == 60
    assert Settings.from_env({"HERD_FINISHED_TTL": "0"}).finished_ttl == 0  # keep them
    for bad in ("-1", "1.5", "a week"):
        with pytest.raises(ConfigError, match="HERD_FINISHED_TTL"):
            Settings.from_env({"HERD_FINISHED_TTL": bad})


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
            # PostgreSQL purges in batches from the claim path; call it as a worker would.
            purge = getattr(app.broker, "purge_finished", None)
            if purge is not None:
                await purge()
            try:
                await app.get_job(job_id)
            except JobNotFound:
                return True
            return False

        assert await eventually(gone, timeout=10), "the job outlived HERD_FINISHED_TTL=1"
