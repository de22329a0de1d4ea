"""The dashboard in headless Chromium against a real `herd serve` process."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest

from herd.app import App
from herd.config import Settings
from herd.queue.base import DeadReason, Failure
from tests.api.browser import ensure_chromium
from tests.api.conftest import TOKEN, serving
from tests.conftest import truncate


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


# The first run on a fresh machine installs chromium (apt-get) inside this test's setup.
@pytest.mark.timeout(1200)
def test_dashboard_shows_jobs_and_requeues_a_dead_letter(chromium, pg_url, herd_home, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    truncate(pg_url)
    known, dead = asyncio.run(seed(pg_url, herd_home))
    with (
        serving(pg_url, herd_home, tmp_path / "serve.log", HERD_API_TOKEN=TOKEN) as url,
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=str(chromium), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1100})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
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
        finally:
            browser.close()
