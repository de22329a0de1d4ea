"""/overview and /metrics show the busiest HERD_SHOWN_QUEUES queues and sum the rest:
whoever may enqueue may name queues, and no poll may grow with their number."""

from __future__ import annotations

import pytest

from herd.app import App
from herd.config import Settings
from tests.api.conftest import clean_side_tables, client_of
from tests.conftest import flush_redis, truncate


@pytest.mark.parametrize("backend", ["postgres", "redis"])
async def test_overview_and_metrics_show_the_busiest_queues_and_one_row_for_the_rest(
    backend, request, pg_url, herd_home
):
    truncate(pg_url)
    settings = Settings(home=herd_home, database_url=pg_url, broker=backend, shown_queues=3)
    if backend == "redis":
        url = request.getfixturevalue("redis_stack")
        flush_redis(url)
        settings = settings.override(redis_url=url)
    app = App(settings=settings)
    async with app, client_of(app) as client:
        clean_side_tables(pg_url)
        for n in range(6):  # queue qN holds N + 1 pending jobs
            await app.enqueue_many("t", [{}] * (n + 1), queue=f"q{n}")
        ov = (await client.get("/overview")).json()
        metrics = (await client.get("/metrics")).text
    rows = {q["queue"]: q["counts"].get("pending", 0) for q in ov["queues"]}
    assert rows == {"q3": 4, "q4": 5, "q5": 6, "{others}": 1 + 2 + 3}
    assert ov["queues_hidden"] == 3
    assert 'queue="{others}"' in metrics and 'queue="q5"' in metrics
    assert not any(f'queue="q{n}"' in metrics for n in range(3))
