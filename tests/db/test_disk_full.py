"""A full disk is named as such, not as a server that is not running."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from herd.db.diskfull import disk_full
from herd.db.postgres import translate_errors
from herd.embedded import EmbeddedPostgres
from herd.errors import BrokerUnavailable, EmbeddedServerError


def test_a_full_disk_the_server_reports_is_named(pg_url):
    # /dev/full fails every write with ENOSPC: the server's own "No space left on
    # device", SQLSTATE 53100, as when its data disk fills.
    copy = "COPY (SELECT repeat('x', 1000) FROM generate_series(1, 10000)) TO '/dev/full'"
    with (
        pytest.raises(BrokerUnavailable) as caught,
        translate_errors(pg_url),
        psycopg.connect(pg_url) as conn,
    ):
        conn.execute(copy)
    text = str(caught.value)
    assert "the server's disk is full" in text and "free space on that disk" in text
    assert "unreachable" not in text and "is the server running" not in text


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, filled; skipped where mounting is not permitted."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        (mnt / "home").mkdir()
        with open(mnt / "filler", "wb") as fh, pytest.raises(OSError, match="No space left"):
            while True:
                fh.write(b"\0" * (1 << 16))
                fh.flush()
        yield mnt / "home"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_an_unreachable_local_server_on_a_full_disk_is_named(full_disk):
    # The embedded server's socket lives in its data folder: a server stopped by a full
    # disk refuses connections there, and that folder's disk tells why.
    url = f"host={full_disk} port=5432 dbname=herd user=postgres connect_timeout=2"
    with pytest.raises(BrokerUnavailable) as caught, translate_errors(url):
        psycopg.connect(url).close()
    text = str(caught.value)
    assert "the server's disk is full" in text and f"{full_disk} has 0 MiB free" in text
    assert "is the server running" not in text


def test_the_embedded_server_says_herd_home_is_full(full_disk):
    with pytest.raises(EmbeddedServerError) as caught:
        EmbeddedPostgres(full_disk).acquire()
    text = str(caught.value)
    assert "the disk holding HERD_HOME is full" in text and "\n" not in text


def test_only_the_servers_own_files_filling_up_say_its_disk_is_full(tmp_path):
    """A COPY to a full file elsewhere (as the first test does, on the suite's shared
    server) leaves ENOSPC in the log: a later failure there is not blamed on the disk."""
    unreachable = psycopg.OperationalError("connection refused")
    url = f"host={tmp_path} port=5432 dbname=herd user=postgres"
    log = tmp_path / "log"
    log.write_text(
        "LOG:  database system is ready to accept connections\n"
        "ERROR:  could not write to COPY file: No space left on device\n"
    )
    assert disk_full(unreachable, url) is None
    with log.open("a") as fh:
        fh.write('ERROR:  could not extend file "base/5/16384": No space left on device\n')
    assert "its log in" in (disk_full(unreachable, url) or "")
    with log.open("a") as fh:
        fh.write("LOG:  database system is ready to accept connections\n")
    assert disk_full(unreachable, url) is None
