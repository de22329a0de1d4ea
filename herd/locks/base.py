"""The lock API and the policy every backend shares: waiting, wake-ups and ``hold()``.

A backend supplies the atomic verbs (try to acquire, renew, release, check) and,
optionally, a listener for release notifications; everything about time on the
client side lives here. The client clock is only ever used to give up sooner
(a wait's deadline, a renewal that could not be confirmed in time), never to
believe a lock is held for longer than the server said.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import socket
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self

from herd import aio
from herd.errors import HerdError, LeaseLost, LockNotAcquired

log = logging.getLogger("herd.locks")

MAX_NAME_BYTES = 1024  # PostgreSQL's NOTIFY payload and btree entries have hard limits


@dataclass(frozen=True)
class LockLease:
    """A held lock: pass it back to renew, release or check, and to fenced writes.

    ``token`` grows strictly per lock name, across holders and expiries, so a
    resource that remembers the highest token it has seen can refuse a stale holder.
    """

    name: str
    token: int
    owner: str
    ttl: float


class Locks(Protocol):
    """Fenced distributed locks; implemented by ``RedisLocks`` and ``PostgresLocks``."""

    async def acquire(
        self,
        name: str,
        *,
        ttl: float,
        owner: str | None = None,
        wait: float = 0.0,
        take_over: bool = False,
    ) -> LockLease | None:
        """The lease, or None if someone else still holds the lock after ``wait`` seconds
        (``take_over``: see ``hold``)."""
        ...

    async def renew(self, lease: LockLease) -> bool:
        """Extend the lease by its ttl; False once it is lost (expired or taken over)."""
        ...

    async def release(self, lease: LockLease) -> bool:
        """Free the lock if this lease still holds it; a stale lease frees nothing (False)."""
        ...

    async def check(self, lease: LockLease) -> bool:
        """Whether this lease still holds the lock."""
        ...

    def hold(
        self,
        name: str,
        *,
        ttl: float,
        wait: float = 0.0,
        owner: str | None = None,
        take_over: bool = False,
    ) -> AbstractAsyncContextManager[LockLease]:
        """Acquire, renew in the background, cancel the body if the lock is lost, release.

        ``take_over``: a lock that ``owner`` holds already is taken as if it had expired
        (a new token, so the earlier holding's renewals and fenced writes are refused).
        For an owner that names one piece of work whose earlier run is known to be over,
        such as a job whose lease was taken over from a dead worker.
        """
        ...


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def _validate(name: str, ttl: float, wait: float) -> None:
    if not name or len(name.encode()) > MAX_NAME_BYTES:
        raise ValueError(f"a lock name must have 1 to {MAX_NAME_BYTES} bytes, not {name!r:.80}")
    if "{" in name or "}" in name:
        # Refused on every backend, so that a name is portable between them.
        raise ValueError(f"lock name {name!r} may not contain braces (they form Redis hash tags)")
    if not (math.isfinite(ttl) and ttl >= 0.001):
        raise ValueError(f"ttl must be at least 0.001 seconds, not {ttl!r}")
    if not (math.isfinite(wait) and wait >= 0):
        raise ValueError(f"wait must be a non-negative number of seconds, not {wait!r}")


class BaseLocks(Locks, ABC):
    """Shared policy. ``poll_interval`` bounds how late a waiter notices an expired lock:
    releases wake waiters at once by notification, expiries are found by polling."""

    def __init__(self, *, owner: str | None = None, poll_interval: float = 0.2) -> None:
        self.owner = owner or default_owner()
        self.poll_interval = poll_interval
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._listener: asyncio.Task[None] | None = None

    # -- what a backend supplies

    @abstractmethod
    async def _try_acquire(
        self, name: str, ttl: float, owner: str, take_over: bool = False
    ) -> int | None:
        """One atomic attempt: the new token, or None while the lock is held (by
        another owner than ``owner``, when ``take_over``)."""

    @abstractmethod
    async def renew(self, lease: LockLease) -> bool: ...

    @abstractmethod
    async def release(self, lease: LockLease) -> bool: ...

    @abstractmethod
    async def check(self, lease: LockLease) -> bool: ...

    async def _listen(self) -> None:
        """Deliver release notifications to ``self._wake(name)`` until cancelled."""
        await asyncio.Event().wait()  # no notifications: waiters poll

    @abstractmethod
    async def open(self) -> None: ...

    async def close(self) -> None:
        if self._listener is not None:
            await aio.stop(self._listener)
            self._listener = None

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the API

    async def acquire(
        self,
        name: str,
        *,
        ttl: float,
        owner: str | None = None,
        wait: float = 0.0,
        take_over: bool = False,
    ) -> LockLease | None:
        if take_over and not owner:
            raise ValueError("take_over needs an owner that names the work, not the process")
        lease, _ = await self._acquire(name, ttl, owner, wait, take_over)
        return lease

    def hold(
        self,
        name: str,
        *,
        ttl: float,
        wait: float = 0.0,
        owner: str | None = None,
        take_over: bool = False,
    ) -> AbstractAsyncContextManager[LockLease]:
        """Hold the lock for the body of an ``async with``.

        Raises LockNotAcquired if the lock is not free within ``wait`` seconds.
        Renews every ttl/3; if a renewal is refused, or cannot be confirmed
        before the lease would expire, the task running the body is cancelled
        and LeaseLost is raised out of the ``async with``. An event loop that is
        blocked for longer than the ttl cannot renew at all: fence the writes
        that matter with the lease's token as well. ``take_over``: see ``Locks.hold``.
        """
        _validate(name, ttl, wait)
        if take_over and not owner:
            raise ValueError("take_over needs an owner that names the work, not the process")
        return _Hold(self, name, ttl, wait, owner or self.owner, take_over)

    # -- waiting

    async def _acquire(
        self, name: str, ttl: float, owner: str | None, wait: float, take_over: bool = False
    ) -> tuple[LockLease | None, float]:
        """The lease and the local time its winning attempt was sent (the earliest
        the server can have started its ttl, hence a safe base for renewals)."""
        _validate(name, ttl, wait)
        owner = owner or self.owner
        deadline = time.monotonic() + wait
        # Registered before the first attempt, so a release that lands between a
        # failed attempt and the wait still wakes us.
        with self._registered(name) as woken:
            while True:
                woken.clear()
                sent = time.monotonic()
                token = await self._try_acquire(name, ttl, owner, take_over)
                if token is not None:
                    return LockLease(name, token, owner, ttl), sent
                left = deadline - time.monotonic()
                if left <= 0:
                    return None, sent
                self._start_listener()
                # Jitter spreads out waiters that were all refused at once.
                nap = min(left, self.poll_interval * random.uniform(0.5, 1.5))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(nap):
                        await woken.wait()

    @contextlib.contextmanager
    def _registered(self, name: str) -> Iterator[asyncio.Event]:
        """An event that ``_wake(name)`` sets, for as long as the block runs."""
        woken = asyncio.Event()
        self._waiters.setdefault(name, set()).add(woken)
        try:
            yield woken
        finally:
            waiters = self._waiters.get(name)
            if waiters is not None:
                waiters.discard(woken)
                if not waiters:
                    del self._waiters[name]

    async def wait_released(self, name: str, timeout: float) -> None:
        """Return when ``name`` is released (notification), at the next poll, or at timeout.

        A hint for callers that want to re-check something the holder was making
        (singleflight) rather than take the lock themselves.
        """
        with self._registered(name) as woken:
            self._start_listener()
            nap = min(timeout, self.poll_interval * random.uniform(0.5, 1.5))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, nap)):
                    await woken.wait()

    def _wake(self, name: str) -> None:
        for event in self._waiters.get(name, ()):
            event.set()

    def _start_listener(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.create_task(self._listen_forever(), name="herd-locks-listen")

    async def _listen_forever(self) -> None:
        backoff = 0.1
        while True:
            try:
                await self._listen()
            except Exception as exc:
                # Notifications are a hint; polling still finds every release.
                log.debug("lock release notifications unavailable (%s); waiters poll", exc)
            await asyncio.sleep(backoff * random.uniform(1.0, 2.0))
            backoff = min(backoff * 2, 5.0)


class _Hold(AbstractAsyncContextManager[LockLease]):
    """``BaseLocks.hold()``. Cancels the body the way ``asyncio.timeout`` does, so an
    outside cancellation still surfaces as CancelledError, never as LeaseLost."""

    def __init__(
        self, locks: BaseLocks, name: str, ttl: float, wait: float, owner: str, take_over: bool
    ) -> None:
        self._locks = locks
        self._name, self._ttl, self._wait, self._owner = name, ttl, wait, owner
        self._take_over = take_over
        self._lease: LockLease | None = None
        self._lost: str | None = None
        self._cancelled = False
        self._exiting = False

    async def __aenter__(self) -> LockLease:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("hold() must be used inside an asyncio task")
        lease, sent = await self._locks._acquire(
            self._name, self._ttl, self._owner, self._wait, self._take_over
        )
        if lease is None:
            raise LockNotAcquired(
                f"lock {self._name!r} is held by someone else"
                + (f" and was not released within {self._wait:g} s" if self._wait else ""),
                name=self._name,
            )
        self._lease, self._task = lease, task
        self._cancelling = task.cancelling()
        self._renewer = asyncio.create_task(
            self._keep(lease, sent), name=f"herd-lock-renew:{lease.name}"
        )
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._lease is not None
        # No await before this line: from here on the renewer may not cancel us.
        self._exiting = True
        try:
            await aio.stop(self._renewer)
        finally:
            # Shielded: a cancellation of the body's task must not strand the lock for a ttl.
            with contextlib.suppress(HerdError):
                await asyncio.shield(self._release(self._lease))
        if self._lost is None:
            return None
        if self._cancelled and self._task.uncancel() > self._cancelling:
            return None  # cancelled from outside as well: that cancellation wins
        if exc_type is None or issubclass(exc_type, asyncio.CancelledError | Exception):
            raise LeaseLost(
                f"lock {self._lease.name!r} (token {self._lease.token}) was lost: {self._lost}"
            ) from exc
        return None

    async def _release(self, lease: LockLease) -> None:
        try:
            await self._locks.release(lease)
        except HerdError as exc:
            log.warning("could not release lock %r (%s); it expires by itself", lease.name, exc)

    async def _keep(self, lease: LockLease, confirmed: float) -> None:
        """Renew every ttl/3. ``confirmed`` is when the last successful attempt was sent."""
        period = lease.ttl / 3
        try:
            while not self._exiting:  # the exit's cancellation may have been dropped
                await asyncio.sleep(max(0.0, confirmed + period - time.monotonic()))
                error: Exception | None = None
                while True:
                    sent = time.monotonic()
                    left = confirmed + lease.ttl - sent
                    if left <= 0:
                        self._lose(f"no renewal confirmed before it expired (last error: {error})")
                        return
                    try:
                        async with asyncio.timeout(left):
                            renewed = await self._locks.renew(lease)
                    except TimeoutError:
                        self._lose("the renewal did not answer before it expired")
                        return
                    except HerdError as exc:
                        error = exc  # transient until the lease would have run out
                        await asyncio.sleep(min(period / 3, left))
                        continue
                    if not renewed:
                        self._lose("the renewal was refused (expired or taken over)")
                        return
                    confirmed = sent
                    break
        except Exception as exc:  # a bug here must not leave the body running unfenced
            self._lose(f"the renewer failed: {exc!r}")

    def _lose(self, why: str) -> None:
        if self._exiting:
            return
        self._lost = why
        self._cancelled = True
        log.warning("lock %r lost (%s); cancelling its holder", self._name, why)
        self._task.cancel(f"herd lock {self._name!r} lost")
