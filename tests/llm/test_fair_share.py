"""Fair shares end to end: a small batch submitted behind a big one on the same
provider, model and key gets its share of the limit at once, instead of waiting
behind the big one's calls (herd.limits.Share), on each job store."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from herd.api import overview
from herd.llm import eval as evaluate
from herd.llm.eval import enqueue_documents
from tests.conftest import flush_redis, truncate
from tests.helpers import eventually
from tests.llm.conftest import clean_eval_tables
from tests.llm.test_limits_eval import KEY, docs, running, spec, worker_app

BIG, SMALL = 60, 6


@pytest.fixture(params=["postgres", "redis"])
def fair_env(request, pg_url, sim, monkeypatch, tmp_path):
    """10 requests a second (a burst of half a request) for a model of this test's own."""
    model = f"sim-fair-{uuid.uuid4().hex[:8]}"  # limiter scopes outlive a test
    limits = tmp_path / "limits.toml"
    limits.write_text(
        f'[[limits]]\nprovider = "openai"\nmodel = "{model}"\nrpm = 10\nperiod = 1.0\n'
    )
    monkeypatch.setenv("HERD_LIMITS", str(limits))
    monkeypatch.setenv("HERD_LIMIT_MAX_WAIT", "60")
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    if request.param == "redis":
        redis_url = request.getfixturevalue("redis_stack")
        flush_redis(redis_url)
        monkeypatch.setenv("HERD_BROKER", "redis")
        monkeypatch.setenv("HERD_REDIS_URL", redis_url)
    truncate(pg_url)
    clean_eval_tables(pg_url)
    return pg_url, model


async def _counts(app, batch: str) -> dict[str, int]:
    status = (await evaluate.batch_status(app, batch)).to_json()
    return {"done": status["done"] + status["failed"], "failed": status["failed"]}


async def test_a_small_batch_behind_a_big_one_is_served_before_the_big_one_ends(fair_env):
    url, model = fair_env
    async with worker_app(url) as app:
        await enqueue_documents(app, spec(model), "big", docs(BIG, "b"))
        # Enough concurrency for every job to be claimed: what is shared here is the
        # limit, among calls that wait for it in one process (one gate per batch).
        async with running(app, BIG + SMALL + 10):

            async def started() -> bool:
                return (await _counts(app, "big"))["done"] >= 5

            await eventually(started, timeout=30, interval=0.05)
            await enqueue_documents(
                app, spec(model), "small", docs(SMALL, "s"), limits={"weight": 2}
            )

            async def sharing() -> dict[str, object] | None:
                status = (await evaluate.batch_status(app, "small")).to_json()
                return status if status["share"] is not None else None

            # `herd eval status` of the small batch: its weight, and its share of the
            # fleet's limit beside the big one's (2 to 1 by weight).
            shown = await eventually(sharing, timeout=30, interval=0.05)
            assert shown["weight"] == 2 and shown["fair_share"] == pytest.approx(2 / 3, abs=0.01)
            (usage,) = [u for u in shown["limit_usage"] if u["shares"]]
            assert {f["batch"]: f["weight"] for f in usage["shares"]} == {"big": 1, "small": 2}
            # The dashboard's "Provider limits" card: the batches using the limit now.
            (card,) = [r for r in await overview.limits(app) if r.scope == usage["scope"]]
            assert "big" in {f.batch for f in card.shares}

            async def small_done() -> bool:
                return (await _counts(app, "small"))["done"] == SMALL

            await eventually(small_done, timeout=60, interval=0.05)

            async def big_done() -> bool:
                return (await _counts(app, "big"))["done"] == BIG

            await eventually(big_done, timeout=60, interval=0.1)
        assert (await _counts(app, "big"))["failed"] == 0
        assert (await _counts(app, "small"))["failed"] == 0
    # The order the limiter let the calls through (a ledger row is opened once a call
    # has its slot): without shares the small batch's calls queue behind the ~50 of the
    # big one already waiting and go last; with them they alternate with its calls, and
    # most of the big one's come after the small one's last. Counted from the ledger,
    # not from polls, so a slow machine cannot move it.
    with psycopg.connect(url) as conn:
        order = [b for (b,) in conn.execute(
            "SELECT batch FROM herd_eval_ledger WHERE batch IN ('big', 'small')"
            " AND kind = 'call' ORDER BY id"
        )]  # fmt: skip
    last_small = max(i for i, b in enumerate(order) if b == "small")
    assert order.count("small") == SMALL and order.count("big") == BIG, order
    assert order[last_small:].count("big") >= 15, order


async def test_a_small_batch_behind_a_big_ones_backlog_is_claimed_in_turns(fair_env):
    """A worker with 2 slots and 60 documents of a big batch waiting before 6 of a small
    one: each claim takes the batches in turn (their jobs carry the batch as a
    concurrency key), so the small batch is answered among the first calls instead of
    after the whole backlog, with no --priority and no slot for every job."""
    url, _ = fair_env
    model = f"sim-turns-{uuid.uuid4().hex[:8]}"  # no limit: only the claims' order counts
    async with worker_app(url) as app:
        await enqueue_documents(app, spec(model), "big", docs(BIG, "b"))
        await enqueue_documents(app, spec(model), "small", docs(SMALL, "s"))
        async with running(app, 2):

            async def both_done() -> bool:
                big, small = await _counts(app, "big"), await _counts(app, "small")
                return big["done"] == BIG and small["done"] == SMALL

            await eventually(both_done, timeout=60, interval=0.05)
        assert (await _counts(app, "big"))["failed"] == 0
    # The order the calls were made in, from the ledger (not from polls): oldest first,
    # the small batch's calls were the last 6 of 66.
    with psycopg.connect(url) as conn:
        order = [b for (b,) in conn.execute(
            "SELECT batch FROM herd_eval_ledger WHERE batch IN ('big', 'small')"
            " AND kind = 'call' ORDER BY id"
        )]  # fmt: skip
    assert order.count("small") == SMALL and order.count("big") == BIG, order
    last_small = max(i for i, b in enumerate(order) if b == "small")
    assert last_small < 3 * SMALL, order
