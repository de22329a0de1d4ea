"""Whether a PostgreSQL failure comes from a full disk, and where: the error names the
real cause instead of "unreachable" (the embedded server under HERD_HOME, a full disk,
reads otherwise as a server that is not running)."""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

# Less free space than this on a local server's disk is called full: PostgreSQL needs
# a WAL segment (16 MiB) and more to start or to write.
LOW_SPACE = 64 << 20
ENOSPC = "No space left on device"


def _socket_dir(url: str) -> Path | None:
    """The local folder of a Unix-socket URL (the embedded server's is its data folder)."""
    try:
        host = str(conninfo_to_dict(url).get("host") or "")
    except psycopg.Error:
        return None
    path = Path(host.split(",")[0])
    return path if path.is_absolute() and path.is_dir() else None


def _log_says_full(folder: Path) -> bool:
    """Whether the server's log (the embedded server's, in its data folder) last said
    the disk was full: after its last start, not in an incident since resolved."""
    log = folder / "log"
    try:
        with log.open("rb") as fh:
            fh.seek(max(0, log.stat().st_size - 16384))
            tail = fh.read()
    except OSError:
        return False
    started = tail.rfind(b"ready to accept connections")
    # A statement's own target filling up (COPY ... TO a file on another disk) is not
    # the server's disk: only the server's own files' errors count.
    full = [at for at, line in _lines(tail) if ENOSPC.encode() in line and b"COPY file" not in line]
    return bool(full) and full[-1] > started


def _lines(tail: bytes) -> list[tuple[int, bytes]]:
    """Each line of the tail with the offset it starts at."""
    out, at = [], 0
    for line in tail.split(b"\n"):
        out.append((at, line))
        at += len(line) + 1
    return out


def low_space(folder: Path) -> str | None:
    """'<folder> has N MiB free' when the disk holding ``folder`` is (nearly) full."""
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    return f"{folder} has {free >> 20} MiB free" if free < LOW_SPACE else None


def disk_full(exc: BaseException, url: str) -> str | None:
    """Why ``exc`` looks like a full disk (for the error's text), or None."""
    folder = _socket_dir(url)
    space = low_space(folder) if folder else None
    if isinstance(exc, psycopg.errors.DiskFull) or ENOSPC in str(exc):
        return f"the server's disk is full{f' ({space})' if space else ''}"
    if folder is not None and (space or _log_says_full(folder)):
        return f"the server's disk is full ({space or f'its log in {folder} says {ENOSPC}'})"
    return None
