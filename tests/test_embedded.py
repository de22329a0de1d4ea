"""The embedded server: shared by processes, stopped by the last, robust to SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from herd.embedded import EmbeddedPostgres
from tests.helpers import eventually_sync
from tests.test_cli import herd

HOLD = """
import signal, sys, time
from pathlib import Path
# SIGINT ends this holder cleanly even when started from a shell's background job,
# which hands its children SIGINT ignored (then Python installs no handler of its own).
signal.signal(signal.SIGINT, signal.default_int_handler)
from herd.embedded import embedded_server
url = embedded_server(Path(sys.argv[1])).acquire()
import psycopg
started = psycopg.connect(url).execute("SELECT pg_postmaster_start_time()").fetchone()[0]
print(url, started.isoformat(), flush=True)
time.sleep(float(sys.argv[2]))
"""


def hold(home: Path, seconds: float) -> tuple[subprocess.Popen[str], str]:
    """A process that holds the embedded server; returns it and the server's start time."""
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(home), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    url, started = p.stdout.readline().split()
    assert url.startswith("postgresql://")
    return p, started


@pytest.fixture
def home(tmp_path_factory):
    # Short path: the server's Unix socket lives in it.
    return tmp_path_factory.mktemp("emb")


@pytest.mark.timeout(120)
def test_shared_by_processes_and_stopped_by_the_last_one(home):
    server = EmbeddedPostgres(home)
    a, a_started = hold(home, 60)
    b, b_started = hold(home, 0)  # joins the running server, exits first
    assert a_started == b_started
    assert b.wait(timeout=30) == 0
    assert server.is_running()  # a still holds it
    a.send_signal(signal.SIGINT)
    a.wait(timeout=30)
    eventually_sync(lambda: not server.is_running(), timeout=30)


@pytest.mark.timeout(120)
def test_a_killed_holder_leaves_a_server_the_next_one_reuses_and_stops(home):
    server = EmbeddedPostgres(home)
    a, a_started = hold(home, 60)
    a.send_signal(signal.SIGKILL)
    a.wait()
    assert server.is_running()  # orphaned, as the wheel leaves it
    b, b_started = hold(home, 0)
    assert b_started == a_started  # b reused the orphan...
    assert b.wait(timeout=30) == 0
    eventually_sync(lambda: not server.is_running(), timeout=30)  # ...and, last, stopped it


@pytest.mark.timeout(120)
def test_a_new_users_first_run_fills_herds_own_database_without_a_warning(home):
    """The embedded server's database is herd's own: its tables appearing on the first
    run is expected (INFO), while a URL the user gives still gets the WARNING
    (tests/db/test_auto_migrate.py)."""
    r = herd("status", "--json", HERD_HOME=str(home))
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if "creating herd's tables" in line]
    assert len(said) == 1 and "INFO" in said[0] and "WARNING" not in r.stderr, r.stderr
    eventually_sync(lambda: not EmbeddedPostgres(home).is_running(), timeout=30)
