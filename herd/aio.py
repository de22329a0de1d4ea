"""Small asyncio helpers that every long-lived herd task needs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from herd.errors import BrokerUnavailable

T = TypeVar("T")

log = logging.getLogger("herd")


async def stop(*tasks: asyncio.Future[Any] | None, every: float = 0.5) -> None:
    """Cancel ``tasks`` and wait until each has ended, cancelling again while one runs on.

    One ``cancel()`` is not always enough on Python 3.11: ``asyncio.wait_for``
    (used inside psycopg_pool's getconn, among others) returns its inner
    result and drops the cancellation when both land in one loop iteration
    (gh-86296, fixed in 3.12), and the task goes on as if never cancelled.
    A plain ``await task`` then waits forever; this does not.
    """
    given = [t for t in tasks if t is not None]
    left = {t for t in given if not t.done()}
    while left:
        for task in left:
            task.cancel()
        _, left = await asyncio.wait(left, timeout=every)
        if left:
            log.debug("%d task(s) ignored a cancellation; cancelling again", len(left))
    for task in given:
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log it as never retrieved


async def through_outage(
    step: Callable[[], Awaitable[T]], what: str, *, patience: float = 30.0
) -> T:
    """``step()``, tried again while its store is unreachable (BrokerUnavailable), for up
    to ``patience`` seconds: for a write that records what was already paid for (a model
    call's answer, its ledger row), where a store restarting or dropping its clients is
    back within seconds and giving up would pay for the work again."""
    pause, deadline = 0.1, time.monotonic() + patience
    while True:
        try:
            return await step()
        except BrokerUnavailable as exc:
            if time.monotonic() + pause > deadline:
                raise
            log.warning("%s not written yet, retrying: %s", what, exc)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)
