"""Debian's PgBouncer in transaction mode in front of the embedded PostgreSQL.

Most production PostgreSQL sits behind PgBouncer in transaction mode, where a
server connection is lent per transaction: prepared statements, session SET,
LISTEN and session advisory locks do not survive from one transaction to the
next. The suite runs the broker contract and the crash test through it.

The binary is found on PATH or in /usr/sbin, else installed with apt-get (as
root, under a file lock, like chromium for the browser test); the fixture skips
with the reason only when that fails. PgBouncer refuses to run as root: as root
it runs as the owner of the embedded server's data folder, the one user that
may open the server's socket in there.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

# One lock for every process of the machine that may run apt-get for it.
LOCK = Path(tempfile.gettempdir()) / "herd-test-pgbouncer.lock"


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(
        ["apt-get", *args], env=env, capture_output=True, text=True, timeout=900, check=False
    )


def _find() -> Path | None:
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer",) if Path(p).exists()), None
    )
    return Path(found) if found else None


def ensure_pgbouncer() -> tuple[Path | None, str]:
    """The binary's path, or None and why there is none."""
    found = _find()
    if found:
        return found, ""
    if shutil.which("apt-get") is None:
        return None, "no pgbouncer and no apt-get to install it"
    if os.geteuid() != 0:
        return None, "no pgbouncer, and installing it needs root"
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (found := _find()) is not None:
            return found, ""
        install = ("install", "-y", "--no-install-recommends", "pgbouncer")
        done = _apt(*install)
        if done.returncode != 0:
            _apt("update")
            done = _apt(*install)
        found = _find()
        if done.returncode != 0 or found is None:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
            return None, f"apt-get install pgbouncer failed: {tail[0]}"
    return found, ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _version(binary: Path) -> tuple[int, ...]:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout
    first = out.split()[1] if len(out.split()) > 1 else "0"
    return tuple(int(x) for x in first.split(".") if x.isdigit())


class PgBouncer:
    """``start()`` it in front of ``server_url`` (the embedded server's socket URL)."""

    def __init__(self, binary: Path, server_url: str, workdir: Path, *, pool_size: int = 40):
        self.binary, self.workdir, self.pool_size = binary, workdir, pool_size
        parts = urlsplit(server_url)
        query = parse_qs(parts.query)
        self.socket_dir = query.get("host", [parts.hostname or "127.0.0.1"])[0]
        self.user = parts.username or "postgres"
        self.server_port = parts.port or 5432
        self.port = _free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "users.txt").write_text(f'"{self.user}" ""\n')
        lines = [
            "[databases]",
            f"* = host={self.socket_dir} port={self.server_port} user={self.user}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.workdir / 'users.txt'}",
            "pool_mode = transaction",
            # A suite's worker opens and closes many pools over a session: room for
            # clients whose sockets are not yet reaped, so that a full client table
            # never reads as a pool that cannot open (seen: setup timeouts in CI).
            "max_client_conn = 2000",
            # A failed server login is retried after 1 s, not PgBouncer's 15 s, which
            # outlasts a pool's 10 s open and failed every test meanwhile.
            "server_login_retry = 1",
            # A line per login and per close is most of what it would write.
            "log_connections = 0",
            "log_disconnections = 0",
            f"default_pool_size = {self.pool_size}",
            f"logfile = {self.workdir / 'pgbouncer.log'}",
            f"pidfile = {self.workdir / 'pgbouncer.pid'}",
            # psycopg sends none of these, other clients (psql, drivers) may.
            "ignore_startup_parameters = extra_float_digits,options",
        ]
        if _version(self.binary) >= (1, 21):
            # Newer PgBouncers can carry prepared statements; herd must not need them.
            lines.append("max_prepared_statements = 0")
        if os.geteuid() == 0:
            owner = pwd.getpwuid(os.stat(self.socket_dir).st_uid).pw_name
            lines.append(f"user = {owner}")
            shutil.chown(self.workdir, owner)
            for name in ("users.txt",):
                shutil.chown(self.workdir / name, owner)
        (self.workdir / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
        # Its stderr to a file, never a pipe: PgBouncer writes every log line there too,
        # and with nobody reading a pipe it blocked on a full one (64 KiB of connection
        # lines into a session) and answered nothing more: the suite's "pool
        # initialization incomplete" setup timeouts through the pooler.
        with (self.workdir / "stderr.log").open("wb") as stderr:
            self._proc = subprocess.Popen(
                [str(self.binary), str(self.workdir / "pgbouncer.ini")],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = (self.workdir / "stderr.log").read_text(errors="replace")
                log = self.workdir / "pgbouncer.log"
                raise RuntimeError(
                    f"pgbouncer exited: {err.strip()} {log.read_text() if log.exists() else ''}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)  # a port that is not open yet: nothing to wait on
        raise RuntimeError(f"pgbouncer did not listen on {self.port} within 15 s")

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of PgBouncer's log: what a failed test through it shows."""
        try:
            text = (self.workdir / "pgbouncer.log").read_text(errors="replace")
        except OSError as exc:
            return f"(no PgBouncer log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
