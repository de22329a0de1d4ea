"""A fake chat model that counts its calls across processes, in the test's PostgreSQL."""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from langchain_core.language_models.fake_chat_models import FakeListChatModel

CALLS = "CREATE TABLE IF NOT EXISTS lc_calls (tag text NOT NULL, pid int NOT NULL)"


class CountedModel(FakeListChatModel):
    counter_url: str
    tag: str  # the test's: calls of other tests are not counted
    seconds: float = 0.0  # how long a call takes
    fail_calls: int = 0  # the first this many calls raise

    def _call(self, *args: Any, **kwargs: Any) -> str:
        with psycopg.connect(self.counter_url, autocommit=True) as conn:
            conn.execute("INSERT INTO lc_calls (tag, pid) VALUES (%s, %s)", (self.tag, os.getpid()))
            (n,) = conn.execute(
                "SELECT count(*) FROM lc_calls WHERE tag = %s", (self.tag,)
            ).fetchone()  # type: ignore[misc]
        time.sleep(self.seconds)
        if n <= self.fail_calls:
            raise ValueError(f"model call {n} failed")
        return super()._call(*args, **kwargs)


def calls(url: str, tag: str) -> int:
    with psycopg.connect(url) as conn:
        (n,) = conn.execute("SELECT count(*) FROM lc_calls WHERE tag = %s", (tag,)).fetchone()  # type: ignore[misc]
    return int(n)
