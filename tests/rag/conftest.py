"""The app every corpus test indexes and queries with, on the suite's PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from herd import App
from herd.builtin import tasks as builtin_tasks
from herd.rag.embedders import spec as specs


@pytest.fixture
async def app(pg_url: str, herd_home: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[App]:
    """An open app with herd's tasks; no HERD_EMBEDDER from the environment, so a new
    collection gets the embedder of new collections."""
    monkeypatch.delenv(specs.ENV, raising=False)
    the_app = App(database_url=pg_url)
    the_app.settings = the_app.settings.override(home=herd_home)  # the model cache lives here
    the_app.include(builtin_tasks)
    async with the_app:
        yield the_app
