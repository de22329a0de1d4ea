"""`herd status`: the dashboard's picture in a terminal, and as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from herd.config import Settings
from herd.errors import ConfigError
from herd.llm.eval.ledger import open_call
from tests.api.conftest import herd_env
from tests.api.test_jobs import dead_job


def herd(pg_url, herd_home, *args):
    return subprocess.run(
        [sys.executable, "-m", "herd", *args],
        env={**herd_env(pg_url, herd_home), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_status_shows_queues_running_dead_letters_caches_and_ledger(
    pg_app, pg_url, herd_home
):
    await pg_app.enqueue("status.known", {"x": 1}, queue="q-status")
    await pg_app.enqueue("status.running", queue="q-run")
    await pg_app.broker.claim(["q-run"], "worker-xyz", 1)
    dead = await dead_job(pg_app, queue="q-dead")
    done = herd(pg_url, herd_home, "status")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for text in ("queues", "q-status", "worker-xyz", "dead-letter queue", "ValueError: boom"):
        assert text in out, text
    assert "cost ledger" in out and "avoided: cache" in out
    as_json = herd(pg_url, herd_home, "status", "--json")
    data = json.loads(as_json.stdout)
    assert [j["id"] for j in data["dead"]] == [dead]
    assert data["running"][0]["owner"] == "worker-xyz"
    assert {q["queue"] for q in data["queues"]} == {"q-status", "q-run", "q-dead"}


def test_status_with_an_unreachable_database_is_one_line_and_exit_1(herd_home, tmp_path):
    url = f"postgresql://nobody@/nowhere?host={tmp_path}&connect_timeout=2"
    done = herd(url, herd_home, "status")
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1 and "unreachable" in done.stderr


def test_settings_from_env_reads_the_body_limit():
    assert Settings.from_env({"HERD_API_BODY_LIMIT": "2048"}).api_body_limit == 2048
    assert Settings.from_env({}).api_body_limit == 1 << 20
    with pytest.raises(ConfigError, match="HERD_API_BODY_LIMIT"):
        Settings.from_env({"HERD_API_BODY_LIMIT": "lots"})


async def test_status_says_unpriced_where_a_model_has_no_price_never_blank_or_zero(
    pg_app, pg_url, herd_home
):
    from herd.llm.eval import EvalRuntime

    rt = await EvalRuntime.of(pg_app)
    # A model without a price: its call's cost, and so what avoiding it saved, are unknown.
    await rt.store.record(batch="b", job_id=7, key="k1", kind="call", input_tokens=10, cost=None)
    await rt.store.record(batch="b", job_id=8, key="k1", kind="cache", input_tokens=0, cost=None)
    done = herd(pg_url, herd_home, "status")
    assert done.returncode == 0, done.stderr
    rows = {line.split("  ")[0]: line.split() for line in done.stdout.splitlines()}
    assert rows["provider calls"][-1] == "unpriced"
    assert rows["avoided: cache"][-1] == "unpriced"
    assert rows["lost (lease lost mid-call)"][-1] == "0"  # no call, nothing to price


async def test_status_says_a_kinds_cost_is_a_part_where_some_of_its_calls_had_no_price(
    pg_app, pg_url, herd_home
):
    from herd.llm.eval import EvalRuntime

    rt = await EvalRuntime.of(pg_app)
    await rt.store.record(batch="b", job_id=7, key="k1", kind="call", input_tokens=10, cost=0.25)
    await rt.store.record(batch="b", job_id=8, key="k2", kind="call", input_tokens=10, cost=None)
    async with rt.store.transaction() as conn:  # an open call, closed without a price
        call = await open_call(conn, {"batch": "b", "job": 9, "key": "k3", "model": "m",
                                      "provider": "openai", "i": 0, "w": None})  # fmt: skip
    await rt.store.close_call(call, "call", i=5, o=1, cost=None)
    assert not await rt.store.close_call(call, "call", i=5, o=1, cost=None)  # counted once
    assert (await rt.store.totals())["call"]["unpriced"] == 2
    done = herd(pg_url, herd_home, "status")
    assert done.returncode == 0, done.stderr
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("provider calls")]
    assert row.rstrip().endswith("$0.2500 + unpriced"), row  # not $0.25 alone
