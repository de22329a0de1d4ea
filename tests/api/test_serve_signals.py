"""`herd serve` stopped by SIGTERM, on the embedded PostgreSQL: the server it started is
stopped too, and the process exits cleanly."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from herd.embedded import EmbeddedPostgres
from tests.api.conftest import free_port
from tests.helpers import eventually_sync
from tests.test_cli import herd


def _postmaster(server: EmbeddedPostgres) -> psutil.Process | None:
    try:
        pid = int((server.pgdata / "postmaster.pid").read_text().split()[0])
        return psutil.Process(pid)
    except (FileNotFoundError, ValueError, IndexError, psutil.Error):
        return None


@pytest.mark.timeout(180)
def test_sigterm_stops_the_embedded_postgres_and_exits_cleanly(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    home = tmp_path_factory.mktemp("srv")  # short: the server's Unix socket lives in it
    server = EmbeddedPostgres(home)
    port = free_port()
    log = tmp_path / "serve.log"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("HERD_")}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "herd", "serve", "--port", str(port)],
            env={**env, "HERD_HOME": str(home)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"herd serve exited: {log.read_text()}")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).is_success
            except httpx.TransportError:
                return False

        eventually_sync(up, timeout=120, interval=0.1)
        postmaster = _postmaster(server)
        assert postmaster is not None and postmaster.is_running()

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
        eventually_sync(lambda: not postmaster.is_running(), timeout=30)
        assert not server.is_running()
        written = log.read_text()
        assert "Traceback" not in written and "Application shutdown complete" in written
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if server.is_running():  # the failure this test is about: do not leave it behind
            server.acquire()
            server.release()
    # The data folder is reusable: the next process starts the server again.
    assert herd("jobs", "list", HERD_HOME=str(home)).returncode == 0
    assert not server.is_running()
