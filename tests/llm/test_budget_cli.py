"""Budgets and limits through `herd eval submit`, `herd eval budget` and `herd eval
status`, run as a user runs them (a subprocess each), against the suite's PostgreSQL."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from herd import App
from herd.llm import eval as evaluate
from tests.conftest import truncate
from tests.llm.conftest import clean_eval_tables, run_until
from tests.test_cli import herd

# One token costs $0.001 either way: a short document's worst case is under $0.1.
PRICES = {"sim-budget": {"input": 1000.0, "output": 1000.0}}
SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer"}},
    "required": ["score"],
}


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    for i in range(3):
        (tmp_path / "docs" / f"d{i}.txt").write_text(f"Document number {i}.")
    (tmp_path / "prompt.txt").write_text("Rate it.")
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "prices.json").write_text(json.dumps(PRICES))
    return tmp_path


@pytest.fixture
def url(pg_url: str) -> str:
    truncate(pg_url)
    clean_eval_tables(pg_url)
    return pg_url


def submit(files: Path, url: str, batch: str, *flags: str):  # type: ignore[no-untyped-def]
    return herd(
        "eval", "submit", str(files / "docs"), "--prompt", str(files / "prompt.txt"),
        "--schema", str(files / "schema.json"), "--model", "sim-budget",
        "--params", '{"max_tokens": 60}', "--batch", batch, "--json", *flags,
        url=url, HERD_PRICES=str(files / "prices.json"),
        # A server that needs no key: the submission is checked, nothing is called.
        OPENAI_BASE_URL=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:9/v1"),
    )  # fmt: skip


def status(url: str, batch: str) -> dict:
    r = herd("eval", "status", "--batch", batch, "--json", url=url)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def test_submit_stores_the_budget_and_limits_and_status_shows_them(files, url):
    batch = f"b-{uuid.uuid4().hex[:8]}"
    flags = ("--budget", "0.5", "--rpm", "10", "--tpm", "1000", "--max-concurrent", "2")
    r = submit(files, url, batch, *flags)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["queued"] == 3
    s = status(url, batch)
    assert s["budget"] == 0.5 and s["spent"] == 0.0 and s["parked"] is None
    assert s["limits"] == {"rpm": 10, "tpm": 1000, "max_concurrent": 2}
    # A later submit to the batch without them leaves them as they are.
    again = submit(files, url, batch)
    assert again.returncode == 0, again.stderr
    s = status(url, batch)
    assert s["budget"] == 0.5 and s["limits"] == {"rpm": 10, "tpm": 1000, "max_concurrent": 2}


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (("--budget", "-1"), "--budget"),
        (("--budget", "nan"), "--budget"),
        (("--rpm", "0"), "--rpm"),
        (("--tpm", "many"), "--tpm"),
        (("--max-concurrent", "0"), "--max-concurrent"),
    ],
)
def test_a_bad_budget_or_limit_is_a_usage_error_naming_the_flag(files, url, flags, named):
    batch = f"bad-{uuid.uuid4().hex[:8]}"
    r = submit(files, url, batch, *flags)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"Invalid value for {named}" in r.stderr.replace("'", ""), r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    gone = herd("eval", "status", batch, url=url)  # nothing was submitted: no such batch
    assert gone.returncode == 1 and f"no batch named '{batch}'" in gone.stderr, gone.stderr


async def test_raising_the_budget_of_a_parked_batch_resumes_it(files, url, sim, monkeypatch):
    monkeypatch.setenv("HERD_PRICES", str(files / "prices.json"))
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET")
    batch = f"park-{uuid.uuid4().hex[:8]}"
    r = submit(files, url, batch, "--budget", "0")  # no call fits: the first job parks it
    assert r.returncode == 0, r.stderr
    app = App(database_url=url)
    app.task(name=evaluate.TASK, queue=evaluate.QUEUE, lease_seconds=5.0)(evaluate.task.evaluate)
    async with app:

        async def parked():  # type: ignore[no-untyped-def]
            s = (await evaluate.batch_status(app, batch)).to_json()
            return s if s["parked"] == "budget" and s["parked_items"] == 3 else None

        await run_until(app, parked, concurrency=3)
        assert sim.stats()["calls"] == 0

        raised = herd("eval", "budget", batch, "1.0", "--json", url=url)
        assert raised.returncode == 0, raised.stderr
        out = json.loads(raised.stdout)
        assert out["budget"] == 1.0 and out["parked"] is None and out["resumed"] == 3
        s = status(url, batch)
        assert s["budget"] == 1.0 and s["parked"] is None and s["parked_items"] == 0

        async def finished():  # type: ignore[no-untyped-def]
            s = (await evaluate.batch_status(app, batch)).to_json()
            # An answer is stored before its ledger row closes: done, and no job still
            # running, so that every call's spend is in.
            return s if s["done"] == 3 and not s["running"] else None

        final = await run_until(app, finished, concurrency=3)
        assert 0 < final["spent"] <= 1.0 and sim.stats()["calls"] == 3


def test_the_budget_of_an_unknown_batch_is_one_clear_line(url):
    r = herd("eval", "budget", "no-such-batch", "1.0", url=url)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no batch named 'no-such-batch'" in lines[0], r.stderr
    bad = herd("eval", "budget", "no-such-batch", "nan", url=url)
    assert bad.returncode == 2 and "Invalid value for USD" in bad.stderr
