"""herd.testing.fleet: a fleet nobody closed (its test cut off by a timeout before its
``finally``) leaves no process behind once the interpreter exits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from herd.testing.fleet import wait_until


async def test_a_fleet_left_open_is_killed_when_its_interpreter_exits(tmp_path):
    script = textwrap.dedent(
        """
        import sys
        from herd.testing.fleet import Fleet
        fleet = Fleet([sys.executable, "-c", "import time; time.sleep(600)"])
        a, b = fleet.start(2)
        fleet.freeze(b.pid)  # a frozen one too: SIGKILL reaches it after SIGCONT
        print(a.pid, b.pid, flush=True)
        raise SystemExit(3)  # no close(), as when a timeout cuts the test short
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ))  # fmt: skip
    assert done.returncode == 3, done.stderr
    pids = [int(p) for p in done.stdout.split()]

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie whose parent (the script) has exited is reaped by init: not running.
        try:
            with open(f"/proc/{pid}/stat") as fh:
                return fh.read().split(") ")[1].startswith("Z")
        except FileNotFoundError:
            return True

    await wait_until(lambda: all(gone(p) for p in pids), 10, what="the fleet's processes gone")
