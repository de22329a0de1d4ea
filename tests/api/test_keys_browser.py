"""The dashboard's Concurrency keys panel in headless Chromium against `herd serve`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from herd.app import App
from herd.config import Settings
from tests.api.browser import browser_page
from tests.api.conftest import TOKEN, serving
from tests.api.test_dashboard_browser import chromium  # noqa: F401 - the fixture

KEY = "<b>tenant</b>:acme"  # markup in a key is shown as text


async def seed(pg_url: str, herd_home: Path) -> None:
    """A key at its limit (2 of 2 running, 3 waiting) and one with room."""
    async with App(settings=Settings(home=herd_home, database_url=pg_url)) as app:
        for _ in range(5):
            await app.enqueue("t.echo", {}, queue="tenants", concurrency_key=KEY,
                              max_running_per_key=2)  # fmt: skip
        await app.enqueue("t.echo", {}, queue="tenants", concurrency_key="tenant:globex",
                          max_running_per_key=4)  # fmt: skip
        # An evaluation batch's key: turns only, no limit (the API says null).
        await app.enqueue("t.echo", {}, queue="tenants", concurrency_key="batch:nightly",
                          max_running_per_key=1_000_000)  # fmt: skip
        assert len(await app.broker.claim(["tenants"], "w", 10)) == 4


@pytest.mark.timeout(600)
def test_dashboard_shows_the_busiest_keys(chromium, pg_url, herd_home, tmp_path):  # noqa: F811
    from playwright.sync_api import expect

    asyncio.run(seed(pg_url, herd_home))
    with (
        serving(pg_url, herd_home, tmp_path / "serve.log", HERD_API_TOKEN=TOKEN) as url,
        browser_page(chromium) as (page, errors),
    ):
        page.goto(url)
        page.fill("#token", TOKEN)
        page.click("#login button")
        rows = page.locator("#keys tbody tr")
        expect(rows).to_have_count(3)
        # Busiest first: running plus waiting.
        cells = [rows.nth(0).locator("td").nth(i) for i in range(4)]
        expect(cells[0]).to_have_text(KEY + "tenants")
        assert [c.inner_text() for c in cells[1:]] == ["2", "2", "3"]
        expect(rows.nth(0).locator(".bar")).to_have_class("bar warn")  # at its limit
        globex = page.locator('#keys tr[data-key="tenants/tenant:globex"]')
        expect(globex.locator("td").nth(2)).to_have_text("4")
        expect(globex.locator(".bar")).to_have_class("bar ok")
        batch = page.locator('#keys tr[data-key="tenants/batch:nightly"]')
        expect(batch.locator("td").nth(2)).to_have_text("none")
        expect(batch.locator(".bar")).to_have_class("bar ok")
        page.locator("#keys-card").screenshot(path=str(tmp_path / "keys.png"))
        assert errors == []
