"""Debian's chromium for the dashboard's browser test, installed by the suite itself."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
LOCK = Path("/tmp/herd-test-chromium.lock")


def _apt(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(
        ["apt-get", *args], env=env, capture_output=True, text=True, timeout=900, check=False
    )


def ensure_chromium() -> tuple[Path | None, str]:
    """The browser's path, or None and why there is none.

    As root with apt-get, installs it under a file lock (suites of several
    checkouts may ask at once), running apt-get update only if the install fails.
    """
    if CHROMIUM.exists():
        return CHROMIUM, ""
    if shutil.which("apt-get") is None:
        return None, "no /usr/bin/chromium and no apt-get to install it"
    if os.geteuid() != 0:
        return None, "no /usr/bin/chromium, and installing it needs root"
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if CHROMIUM.exists():
            return CHROMIUM, ""
        install = ("install", "-y", "--no-install-recommends", "chromium")
        done = _apt(*install)
        if done.returncode != 0:
            _apt("update")
            done = _apt(*install)
        if done.returncode != 0 or not CHROMIUM.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
            return None, f"apt-get install chromium failed: {tail[0]}"
    return CHROMIUM, ""


@contextmanager
def browser_page(
    chromium: Path, width: int = 1440, height: int = 1100
) -> Iterator[tuple[Any, list[str]]]:
    """A page of headless ``chromium`` at ``width`` x ``height``, and the errors its
    scripts raise (a test asserts there are none)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page, errors
        finally:
            browser.close()
