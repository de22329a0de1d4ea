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


class PortalBacked:
    """An async core run on a loop thread of its own, opened on first use (the
    integrations' sync-and-async facades)."""

    def __init__(self, name: str) -> None:
        self._portal_name = name
        self._portal: Portal | None = None
        self._made = threading.Lock()
        self._opened = False
        self._opening: asyncio.Lock | None = None  # made on the portal's loop

    def _loop_thread(self) -> Portal:
        with self._made:
            if self._portal is None:
                self._portal = Portal(self._portal_name, on_exit=self._close_if_open)
            return self._portal

    async def _ready(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            if not self._opened:
                if self._opening is None:
                    self._opening = asyncio.Lock()
                async with self._opening:
                    if not self._opened:
                        await self._open()
                        self._opened = True
        except BaseException:
            coro.close()  # never started: no "coroutine was never awaited" warning
            raise
        return await coro

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop_thread().call(self._ready(coro))

    async def _acall(self, coro: Coroutine[Any, Any, T]) -> T:
        return await self._loop_thread().acall(self._ready(coro))

    async def _open(self) -> None:
        raise NotImplementedError

    async def _close(self) -> None:
        raise NotImplementedError

    async def _close_if_open(self) -> None:
        if self._opened:
            self._opened = False
            await self._close()

    def close(self) -> None:
        """Close the connections and stop the loop thread (a later call opens both again)."""
        with self._made:
            portal, self._portal = self._portal, None
        if portal is not None:
            try:
                portal.call(self._close_if_open())
            finally:
                portal.stop()
                self._opening = None
