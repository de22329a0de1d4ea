"""A fleet of worker processes to start, kill, freeze and wait on, cleaned up on exit.

What a crash test, a chaos run and a benchmark all do with real workers::

    env = worker_env(broker="redis", redis_url=url, pythonpath=[ROOT])
    with Fleet(herd_worker("myapp:app", "--concurrency", "3"), env, logs=tmp) as fleet:
        victim, *others = fleet.start(3)
        await wait_until(lambda: holds_a_job(victim.pid), 30, what="a job on the victim")
        fleet.kill(victim.pid)          # SIGKILL, reaped
        fleet.freeze(others[0].pid)     # SIGSTOP ... fleet.thaw(pid): SIGCONT
        codes = fleet.stop()            # SIGTERM, wait, SIGKILL what outlives the wait

Leaving the block (also on an error) continues and SIGKILLs every process still
running, so a failed test leaves no worker behind; a fleet nobody closed (a test cut
off by its timeout before its ``finally`` ran) is closed when the interpreter exits.
Each process runs in a session of
its own: a Ctrl-C in the terminal reaches the script, not its workers. The command may
be any program (``Fleet(lambda n: ["celery", ..., f"w{n}@bench"], env)``); a fleet is
safe to use from several threads (a killer thread beside the main loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

T = TypeVar("T")


def herd_worker(*args: str, broker: str | None = None) -> list[str]:
    """The command line of one ``herd worker`` process with ``args`` (the app, options),
    run by this interpreter; ``broker`` becomes the global ``--broker`` flag."""
    flags = ["--broker", broker] if broker else []
    return [sys.executable, "-m", "herd", *flags, "worker", *args]


def worker_env(
    *,
    broker: str | None = None,
    database_url: str | None = None,
    redis_url: str | None = None,
    home: Path | str | None = None,
    pythonpath: Iterable[Path | str] = (),
    base: Mapping[str, str] | None = None,
    **extra: str,
) -> dict[str, str]:
    """The environment of a worker: ``base`` (this process's by default) with the
    HERD_* settings given, ``pythonpath`` ahead of the inherited PYTHONPATH, and
    ``extra`` variables on top."""
    env = dict(os.environ if base is None else base)
    paths = [str(p) for p in pythonpath]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    settings = {
        "HERD_BROKER": broker,
        "HERD_DATABASE_URL": database_url,
        "HERD_REDIS_URL": redis_url,
        "HERD_HOME": None if home is None else str(home),
    }
    env.update({k: v for k, v in settings.items() if v is not None})
    env.update(extra)
    return env


@dataclass
class Member:
    """One process of a fleet."""

    seq: int  # 1 for the first process the fleet started, 2 for the next ...
    popen: subprocess.Popen[bytes]
    log: Path | None
    signalled: bool = False  # the fleet sent it SIGKILL or SIGTERM: its exit is expected

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def running(self) -> bool:
        return self.popen.poll() is None


class Fleet:
    """Processes started from one command line and environment (see the module)."""

    def __init__(
        self,
        command: Sequence[str] | Callable[[int], Sequence[str]],
        env: Mapping[str, str] | None = None,
        *,
        logs: Path | None = None,
        name: str = "worker",
        cwd: Path | str | None = None,
    ) -> None:
        """``command``: the argv, or a function of the process's ``seq`` that returns it.
        ``logs``: a folder for each process's stdout and stderr (``NAME-SEQ.log``);
        None sends them to /dev/null."""
        self._command = command
        self.env = dict(os.environ if env is None else env)
        self.logs = logs
        self.name = name
        self.cwd = cwd
        self.members: list[Member] = []  # the current slots, in start order
        self.started = 0
        # Held by every change to ``members``; hold it too to pick a member and act on it
        # while another thread may replace it.
        self.lock = threading.RLock()
        # Closed when collected or at the interpreter's exit if nobody closed it (not
        # after SIGKILL or os._exit): the finalizer holds the list, not the fleet.
        weakref.finalize(self, _kill_all, self.members, self.lock)

    # Starting ----------------------------------------------------------------------

    def start(self, n: int = 1, *, prefix: Sequence[str] = ()) -> list[Member]:
        """Start ``n`` processes; ``prefix`` goes before the command (``ip netns exec
        NS``: a prefix that execs in place keeps the pid the worker's own)."""
        return [self._append(self._spawn(prefix)) for _ in range(n)]

    def replace(self, pid: int, *, prefix: Sequence[str] = ()) -> Member:
        """SIGKILL ``pid`` (if it still runs) and start another in its slot."""
        with self.lock:
            old = self.kill(pid)
            new = self._spawn(prefix)
            self.members[self.members.index(old)] = new
            return new

    def _spawn(self, prefix: Sequence[str]) -> Member:
        with self.lock:
            self.started += 1
            seq = self.started
        argv = self._command(seq) if callable(self._command) else self._command
        log = None if self.logs is None else self.logs / f"{self.name}-{seq:03d}.log"
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
        with open(log or os.devnull, "ab") as out:  # the child keeps its own copy
            popen = subprocess.Popen(
                [*prefix, *argv],
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return Member(seq, popen, log)

    def _append(self, member: Member) -> Member:
        with self.lock:
            self.members.append(member)
        return member

    # Finding -----------------------------------------------------------------------

    def member(self, pid: int) -> Member:
        with self.lock:
            for m in self.members:
                if m.pid == pid:
                    return m
        raise KeyError(f"no process {pid} in this fleet")

    @property
    def running(self) -> list[Member]:
        with self.lock:
            return [m for m in self.members if m.running]

    def exited(self) -> list[Member]:
        """The processes that ended though the fleet neither killed nor terminated them."""
        with self.lock:
            return [m for m in self.members if not m.signalled and not m.running]

    # Signals -----------------------------------------------------------------------

    def kill(self, pid: int) -> Member:
        """SIGKILL and reap: the process is gone when this returns."""
        m = self.member(pid)
        m.signalled = True
        self._signal(m, signal.SIGKILL)
        m.popen.wait()
        return m

    def terminate(self, pid: int) -> Member:
        """SIGTERM (a graceful stop: the worker finishes or hands back its jobs)."""
        m = self.member(pid)
        m.signalled = True
        self._signal(m, signal.SIGCONT)  # a frozen worker could not act on it
        self._signal(m, signal.SIGTERM)
        return m

    def freeze(self, pid: int) -> Member:
        """SIGSTOP: the process holds its connections and leases but does nothing."""
        m = self.member(pid)
        self._signal(m, signal.SIGSTOP)
        return m

    def thaw(self, pid: int) -> Member:
        """SIGCONT after ``freeze``."""
        m = self.member(pid)
        self._signal(m, signal.SIGCONT)
        return m

    @staticmethod
    def _signal(m: Member, signum: int) -> None:
        if m.running:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                m.popen.send_signal(signum)

    # Ending ------------------------------------------------------------------------

    def stop(self, timeout: float = 30.0, pids: Iterable[int] | None = None) -> list[int | None]:
        """SIGTERM the processes (by default every one still running), wait up to
        ``timeout`` s for them all, SIGKILL what still runs; their exit codes in that
        order (None: it had to be killed)."""
        with self.lock:
            chosen = self.running if pids is None else [self.member(p) for p in pids]
        for m in chosen:
            self.terminate(m.pid)
        deadline = time.monotonic() + timeout
        codes: list[int | None] = []
        for m in chosen:
            try:
                codes.append(m.popen.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill(m.pid)
                codes.append(None)
        return codes

    def close(self) -> None:
        """SIGKILL every process still running (continued first) and reap them all."""
        _kill_all(self.members, self.lock)

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _kill_all(members: list[Member], lock: threading.RLock) -> None:
    with lock:
        chosen = list(members)
    for m in chosen:
        Fleet._signal(m, signal.SIGCONT)
        Fleet._signal(m, signal.SIGKILL)
    for m in chosen:
        with contextlib.suppress(subprocess.TimeoutExpired):
            m.popen.wait(timeout=10)


@overload
async def wait_until(
    predicate: Callable[[], Awaitable[T]],
    timeout: float,
    *,
    what: str | None = None,
    interval: float = 0.02,
) -> T: ...


@overload
async def wait_until(
    predicate: Callable[[], T], timeout: float, *, what: str | None = None, interval: float = 0.02
) -> T: ...


async def wait_until(
    predicate: Callable[[], Any],
    timeout: float,
    *,
    what: str | None = None,
    interval: float = 0.02,
) -> Any:
    """Call ``predicate`` (sync or async) every ``interval`` s until it returns something
    truthy, and return that; past ``timeout`` s raise TimeoutError naming ``what`` (the
    predicate's name by default) and the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            awaited = what or getattr(predicate, "__qualname__", repr(predicate))
            raise TimeoutError(
                f"timed out after {timeout:g}s waiting for {awaited} (last value {value!r})"
            )
        await asyncio.sleep(interval)
