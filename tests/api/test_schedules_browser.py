"""The dashboard's Schedules section in headless Chromium against `herd serve`."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from herd.app import App
from herd.config import Settings
from herd.schedule.model import Schedule
from herd.schedule.ticker import Ticker
from tests.api.browser import browser_page
from tests.api.conftest import TOKEN, serving
from tests.api.test_dashboard_browser import chromium  # noqa: F401 - the fixture


async def seed(pg_url: str, herd_home: Path, name: str) -> None:
    """A paused schedule with <markup> in its name (shown as text), run once by hand."""
    async with App(settings=Settings(home=herd_home, database_url=pg_url)) as app:
        app.add_schedule(Schedule(name, "reports.nightly", queue="reports", cron="0 2 * * *",
                                  timezone="Asia/Jakarta"))  # fmt: skip
        await Ticker(app, clock=lambda: datetime(2026, 12, 3, 12, tzinfo=UTC)).register()
        await app.broker.pause_schedule(name, True, None)


@pytest.mark.timeout(600)
def test_dashboard_lists_schedules(chromium, pg_url, herd_home, tmp_path):  # noqa: F811
    from playwright.sync_api import expect

    name = f"<b>nightly</b>-{uuid.uuid4().hex[:6]}"
    asyncio.run(seed(pg_url, herd_home, name))
    with (
        serving(pg_url, herd_home, tmp_path / "serve.log", HERD_API_TOKEN=TOKEN) as url,
        browser_page(chromium) as (page, errors),
    ):
        page.goto(url)
        page.fill("#token", TOKEN)
        page.click("#login button")
        row = page.locator("#schedules tbody tr").filter(has_text=name)
        expect(row).to_contain_text("0 2 * * * (Asia/Jakarta)")
        expect(row).to_contain_text("paused")
        expect(row).to_contain_text("reports.nightly → reports")
        assert errors == []
