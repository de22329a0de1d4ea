"""The dashboard in headless Chromium against a real `herd serve` process."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import psycopg
import pytest

from herd import Worker
from herd.app import App
from herd.config import Settings
from herd.llm.eval import EvalRuntime, EvalSpec, submit_texts
from herd.llm.eval.ledger import open_call
from herd.queue.base import Completion, DeadReason, Failure
from tests.api.browser import browser_page, ensure_chromium
from tests.api.conftest import TOKEN, clean_side_tables, serving
from tests.conftest import truncate
from tests.llm.conftest import SECRET, Sim, sim_server  # noqa: F401


@pytest.fixture(scope="session")
def chromium() -> Path:
    path, why = ensure_chromium()
    if path is None:
        pytest.skip(f"no browser for the dashboard test: {why}")
    return path


async def seed(pg_url: str, herd_home: Path) -> tuple[int, int]:
    """A known pending job, a running one and a dead-lettered one."""
    async with App(settings=Settings(home=herd_home, database_url=pg_url)) as app:
        known = await app.enqueue(
            "reports.nightly", {"customer": "ACME <b>bold</b>"}, queue="reports"
        )
        await app.enqueue("slow.task", queue="work")
        await app.broker.claim(["work"], "worker-7", 1)
        dead = await app.enqueue("flaky.task", {"n": 1}, queue="flaky")
        (lease,) = await app.broker.claim(["flaky"], "worker-7", 1)
        failure = Failure(lease, "TimeoutError: upstream", final=True, reason=DeadReason.FATAL)
        await app.broker.fail_if_leased(failure)
        return known.job_id, dead.job_id


BATCH = "run-<i>3</i>"
UNPRICED = "notes-unpriced"
REASON = "its budget is spent: $1.13 of $0.75"


async def seed_parked_batch(pg_url: str, herd_home: Path) -> dict[str, int]:
    """A batch of four documents parked on its budget: one answered (by a priced call),
    one dead-lettered, two parked. Its names are markup, to be shown as text."""
    async with App(settings=Settings(home=herd_home, database_url=pg_url)) as app:
        spec = EvalSpec(model="gpt-4o-mini", system="Grade it.", schema={"type": "object"})
        docs = {f"docs/{n}.txt": f"Document {n}." for n in ("a", "<b>b</b>", "c", "d")}
        report = await submit_texts(app, spec, docs, batch=BATCH, budget=0.75)
        jobs = dict(zip(docs, report.job_ids, strict=True))
        rt = await EvalRuntime.of(app)
        (answered,) = await app.broker.claim(["eval"], "worker-1", 1)
        key = answered.payload["key"]
        async with rt.store.transaction() as conn:
            call = await open_call(conn, {"batch": BATCH, "job": answered.job_id, "key": key,
                                          "model": "gpt-4o-mini", "provider": "openai",
                                          "i": 0, "w": 1.0})  # fmt: skip
        await rt.store.close_call(call, "call", i=1200, o=300, cost=0.77)
        await app.broker.complete_if_leased(
            [Completion(answered, {"source": "call", "output": {"grade": "A"}})]
        )
        (dying,) = await app.broker.claim(["eval"], "worker-1", 1)
        async with rt.store.transaction() as conn:  # its worker died mid-call
            call = await open_call(conn, {"batch": BATCH, "job": dying.job_id,
                                          "key": dying.payload["key"], "model": "gpt-4o-mini",
                                          "provider": "openai", "i": 900, "w": 0.36})  # fmt: skip
        await rt.store.close_call(call, "cut_short")  # charged its worst case
        failure = Failure(dying, "SchemaError: 'grade' is a required property", final=True,
                          reason=DeadReason.FATAL)  # fmt: skip
        await app.broker.fail_if_leased(failure)
        await rt.store.park(BATCH, "budget", REASON)
        # A batch of a model without a price: its spend is unknown, never $0.
        spec = EvalSpec(model="sim-small", system="Grade it.", schema={"type": "object"})
        await submit_texts(app, spec, {"notes/x.md": "Note."}, batch=UNPRICED, priority=5)
        (lease,) = await app.broker.claim(["eval"], "worker-1", 1)
        async with rt.store.transaction() as conn:
            call = await open_call(conn, {"batch": UNPRICED, "job": lease.job_id,
                                          "key": lease.payload["key"], "model": "sim-small",
                                          "provider": "openai", "i": 0, "w": None})  # fmt: skip
        await rt.store.close_call(call, "call", i=50, o=10, cost=None)
        return {"answered": answered.job_id, "dead": dying.job_id, **jobs}


# The first run on a fresh machine installs chromium (apt-get) inside this test's setup.
@pytest.mark.timeout(1200)
def test_dashboard_shows_jobs_and_requeues_a_dead_letter(chromium, pg_url, herd_home, tmp_path):
    from playwright.sync_api import expect

    truncate(pg_url)
    known, dead = asyncio.run(seed(pg_url, herd_home))
    with (
        serving(pg_url, herd_home, tmp_path / "serve.log", HERD_API_TOKEN=TOKEN) as url,
        browser_page(chromium) as (page, errors),
    ):
        # A CSP violation (an inline style, say) is a console error; the first
        # /overview answers 401 before the token is typed, which is expected.
        page.on(
            "console",
            lambda m: m.type == "error" and "401" not in m.text and errors.append(m.text),
        )
        page.goto(url)
        # The server wants a token: the page asks for it, then keeps it for this tab.
        expect(page.locator("#login")).to_be_visible()
        page.fill("#token", TOKEN)
        page.click("#login button")
        recent = page.locator(f"#recent tr[data-job='{known}']")
        expect(recent).to_contain_text("reports.nightly")
        expect(recent).to_contain_text("ACME <b>bold</b>")  # shown as text, never as markup
        expect(page.locator("#running")).to_contain_text("worker-7")
        expect(page.locator("#state")).to_have_text("live")
        row = page.locator(f"#dead tr[data-job='{dead}']")
        expect(row).to_contain_text("TimeoutError: upstream")
        expect(row).to_contain_text("fatal")
        row.get_by_role("button", name="Requeue").click()
        expect(row).to_have_count(0)
        expect(page.locator("#dead")).to_contain_text("the dead-letter queue is empty")
        job = httpx.get(f"{url}/jobs/{dead}", headers={"Authorization": f"Bearer {TOKEN}"})
        assert job.json()["status"] == "pending"
        page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        shots = os.environ.get("HERD_SCREENSHOTS")
        if shots:
            page.screenshot(path=str(Path(shots) / "dashboard-test.png"), full_page=True)
        assert errors == []


@pytest.mark.timeout(600)
def test_dashboard_shows_a_batch_parked_on_its_budget(
    chromium, pg_url, herd_home, tmp_path, monkeypatch
):
    from playwright.sync_api import expect

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # checked at submit; no call is made
    truncate(pg_url)
    clean_side_tables(pg_url)
    jobs = asyncio.run(seed_parked_batch(pg_url, herd_home))
    dead_path = next(p for p, j in jobs.items() if p.startswith("docs/") and j == jobs["dead"])
    with (
        serving(pg_url, herd_home, tmp_path / "serve.log") as url,
        browser_page(chromium) as (page, errors),
    ):
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.goto(url)
        card = page.locator(f"article.batch[data-batch='{BATCH}']")
        expect(card.locator(".name")).to_have_text(BATCH)  # text, never markup
        expect(card.locator(".pill")).to_have_text("parked")
        banner = card.locator(".park-banner")
        expect(banner.locator("strong")).to_have_text("Parked")
        expect(banner).to_contain_text(REASON)
        expect(banner.locator("code.next")).to_have_text(f"herd eval budget {BATCH} USD")
        expect(card.locator(".done-of")).to_have_text("1 / 4 answered")
        legend = card.locator(".seglegend")
        for text in ("1 answered", "1 dead", "0 queued", "2 parked"):
            expect(legend).to_contain_text(text)
        expect(card.locator(".segbar > i")).to_have_count(3)
        spend = card.locator(".spend")
        expect(spend.locator(".value")).to_have_text("$1.13")
        expect(spend).to_contain_text("of $0.75 budget (151%)")
        expect(spend).to_contain_text("incl. ≈$0.36 estimated")
        costs = card.locator("table.costs")
        expect(costs).to_contain_text("cost by model")
        expect(costs.locator("tbody tr")).to_contain_text("gpt-4o-mini")
        expect(costs.locator("tbody tr")).to_contain_text("$1.13incl. ≈$0.36 estimated")
        failed = card.locator(f"table.failures tr[data-job='{jobs['dead']}']")
        expect(failed).to_contain_text(dead_path)
        expect(failed).to_contain_text("SchemaError: 'grade' is a required property")
        # In the jobs views, an evaluation job goes by its document's path.
        expect(page.locator(f"#dead tr[data-job='{jobs['dead']}']")).to_contain_text(dead_path)
        queued = next(p for p, j in jobs.items() if p.startswith("docs/") and j not in
                      (jobs["dead"], jobs["answered"]))  # fmt: skip
        expect(page.locator(f"#recent tr[data-job='{jobs[queued]}'] td.path")).to_have_text(queued)
        other = page.locator(f"article.batch[data-batch='{UNPRICED}']")
        expect(other.locator(".spend .value")).to_have_text("unpriced")
        expect(other.locator(".spend")).to_contain_text("no price for sim-small")
        expect(other.locator("table.costs tbody td").last).to_have_text("unpriced")
        expect(other.locator(".pill")).to_have_text("running")  # its job is running
        page.screenshot(path=str(tmp_path / "batches.png"), full_page=True)
        shots = os.environ.get("HERD_SCREENSHOTS")
        if shots:
            page.screenshot(path=str(Path(shots) / "dashboard-batch.png"), full_page=True)
        assert errors == []


async def seed_unpriced_ledger(pg_url: str, herd_home: Path) -> None:
    """A call to a model without a price and one avoided by the cache (both unknown),
    and a priced call ($0.25)."""
    async with App(settings=Settings(home=herd_home, database_url=pg_url)) as app:
        rt = await EvalRuntime.of(app)
        for kind, job, key, cost in (("call", 7, "k1", None), ("cache", 8, "k1", None),
                                     ("call", 9, "k2", 0.25)):  # fmt: skip
            await rt.store.record(batch="b", job_id=job, key=key, kind=kind,
                                  input_tokens=10, cost=cost)  # fmt: skip


def test_the_cost_ledger_says_unpriced_where_a_model_has_no_price(
    chromium,  # noqa: F811
    pg_url,
    herd_home,
    tmp_path,
):
    from playwright.sync_api import expect

    truncate(pg_url)
    clean_side_tables(pg_url)
    asyncio.run(seed_unpriced_ledger(pg_url, herd_home))
    with (
        serving(pg_url, herd_home, tmp_path / "serve.log") as url,
        browser_page(chromium) as (page, errors),
    ):
        page.goto(url)
        rows = page.locator("#ledger tbody tr")
        cost = {label: rows.filter(has_text=label).locator("td").nth(3) for label in (
            "provider calls", "avoided: cache", "lost (lease", "spent", "saved")}  # fmt: skip
        # Not $0, not blank, and not the priced call's $0.25 alone.
        expect(cost["provider calls"]).to_have_text("$0.2500 + unpriced")
        expect(cost["avoided: cache"]).to_have_text("unpriced")
        expect(cost["lost (lease"]).to_have_text("")  # no such call: nothing to price
        expect(cost["spent"]).to_have_text("$0.2500 + unpriced")
        expect(cost["saved"]).to_have_text("unpriced")
        expect(page.locator("#k-saved")).to_have_text("unpriced")
        page.locator("#ledger").screenshot(path=str(tmp_path / "ledger.png"))
        assert errors == []


PIPE_BATCH = "manuals-in-stages"


@pytest.fixture
def fresh_sim(sim_server: Sim) -> Sim:  # noqa: F811 (the fixture imported above)
    sim_server.reset()
    return sim_server


async def seed_pipeline_batch(pg_url: str, herd_home: Path, sim: Sim) -> None:
    """A batch in stages run to its end on the simulator: two manuals split by heading,
    a note per section (one section's answer invalid twice: a failed piece, skipped),
    a summary per manual."""
    from herd.llm import eval as evaluate
    from herd.llm.eval import stages
    from herd.llm.eval.pipeline import from_json
    from herd.llm.eval.pipesubmit import submit_pipeline_texts

    pipe = from_json({"defaults": {"model": "gpt-4o-mini"}, "stages": [
        {"name": "sections", "kind": "split", "by": "headings", "depth": 2},
        {"name": "register-notes", "kind": "map", "prompt": "Note the register.",
         "schema": {"type": "object"}, "on_dead": "skip"},
        {"name": "summary", "kind": "reduce", "prompt": "Sum up.", "schema": {"type": "object"}},
    ]})  # fmt: skip
    docs = {
        f"manuals/{d}.md": "\n\n".join(
            [f"# Device {d}", "Intro."]
            + [f"## Register {i}\n\nBits {i} to {i + 7}." for i in range(1, 4 + d)]
        )
        for d in range(2)
    }
    async with App(settings=Settings(home=herd_home, database_url=pg_url)) as app:
        app.task(name=stages.STAGE_TASK, queue=evaluate.QUEUE, lease_seconds=30.0,
                 max_attempts=1)(stages.run_stage)  # fmt: skip
        sim.configure(script=["ok", "invalid", "invalid"])  # piece 1 of the first manual
        await submit_pipeline_texts(app, pipe, docs, batch=PIPE_BATCH)
        await Worker(app, queues=[evaluate.QUEUE], concurrency=1, poll_interval=0.05,
                     stop_when_idle=True, install_signal_handlers=False).run()  # fmt: skip
        sim.configure(script=[])


@pytest.mark.timeout(1200)
def test_dashboard_shows_each_stage_of_a_batch_in_stages(
    chromium, pg_url, herd_home, tmp_path, monkeypatch, fresh_sim
):
    from playwright.sync_api import expect

    from tests.api.conftest import clean_side_tables

    prices = tmp_path / "prices.json"
    prices.write_text('{"gpt-4o-mini": {"input": 150, "output": 600}}')  # $ per 1M tokens
    monkeypatch.setenv("HERD_PRICES", str(prices))
    monkeypatch.setenv("OPENAI_BASE_URL", fresh_sim.openai_url)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    truncate(pg_url)
    clean_side_tables(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("TRUNCATE herd_eval_pieces, herd_eval_fanin, herd_eval_pipelines")
    asyncio.run(seed_pipeline_batch(pg_url, herd_home, fresh_sim))
    with (
        serving(pg_url, herd_home, tmp_path / "serve.log") as url,
        browser_page(chromium, 1280, 900) as (page, errors),
    ):
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.goto(url)
        card = page.locator(f"article.batch[data-batch='{PIPE_BATCH}']")
        expect(card.locator(".done-of")).to_have_text("2 / 2 answered")
        rows = card.locator("table.stages tbody tr")
        expect(rows).to_have_count(2)
        notes = card.locator("table.stages tr[data-stage='register-notes']")
        # 4 + 5 sections, one of them failed (skipped: its manual was still summed).
        expect(notes.locator("td").first).to_contain_text("map · gpt-4o-mini")
        expect(notes.locator(".frac")).to_have_text("8 / 9")
        expect(notes.locator("td.failed")).to_have_text("1")
        expect(notes.locator("td.failed")).to_have_class("n failed bad")
        expect(notes.locator(".segbar > i")).to_have_count(2)  # answered, failed
        summary = card.locator("table.stages tr[data-stage='summary']")
        expect(summary.locator(".frac")).to_have_text("2 / 2")
        expect(summary.locator("td.failed")).to_have_text("0")
        expect(summary.locator("td.n").nth(2)).to_have_text("2")  # calls
        for row in (notes, summary):
            expect(row.locator("td.cost")).to_contain_text("$")
        page.screenshot(path=str(tmp_path / "stages.png"), full_page=True)
        shots = os.environ.get("HERD_SCREENSHOTS")
        if shots:
            card.screenshot(path=str(Path(shots) / "dashboard-stages.png"))
        assert errors == []
