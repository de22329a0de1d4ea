"""An event loop in a thread of its own, so that synchronous callers reach an async core.

Connections (redis-py's, psycopg's pools) belong to the loop that opened them;
a sync facade therefore keeps one loop alive for its whole life instead of an
``asyncio.run`` per call, which would reconnect every time.

A script that never closes its facade still exits quietly: the portal runs the
facade's ``on_exit`` coroutine (closing its pools) from an ``atexit`` hook while
its thread still runs, instead of leaving the pools' tasks to be destroyed
pending with the loop. The hook keeps the facade alive until it is closed or the
process exits.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("herd")

EXIT_TIMEOUT = 10.0
"""Seconds the ``atexit`` hook gives ``on_exit`` before the loop is stopped anyway."""


class Portal:
    def __init__(
        self, name: str, *, on_exit: Callable[[], Coroutine[Any, Any, Any]] | None = None
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._on_exit = on_exit
        atexit.register(self._at_exit)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(f"a sync method was called from {self._thread.name}'s own loop")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def acall(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro`` run on the portal's loop, awaited from another loop (whose
        connections would otherwise not be the portal's)."""
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def stop(self) -> None:
        atexit.unregister(self._at_exit)
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _at_exit(self) -> None:
        if self._on_exit is not None and self._thread.is_alive():
            future = asyncio.run_coroutine_threadsafe(self._on_exit(), self._loop)
            try:
                future.result(EXIT_TIMEOUT)
            except Exception as exc:  # at exit there is no caller left to raise to
                log.warning("closing %s at exit failed: %s", self._thread.name, exc)
        self.stop()
