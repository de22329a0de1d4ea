"""The simulator as a child process, the way tests, chaos runs and benchmarks start it.

A process of its own (not ``Simulator().start()`` on a thread) keeps the simulator's
latency sleeps and JSON work off the caller's interpreter, so what a benchmark
measures is the client's cost alone::

    with SimulatorProcess("--latency", "0.2:0.5", "--seed", "7", log=tmp / "sim.log") as sim:
        client = OpenAICompatible(base_url=sim.url + "/v1", ...)
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


class SimulatorProcess:
    """``python -m herd.testing.simulator --port 0 ARGS`` on ``host``; ``url`` once it listens."""

    def __init__(
        self,
        *args: str,
        host: str = "127.0.0.1",
        log: Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Start it and wait up to ``timeout`` s for the URL it prints first; ``log``
        takes its stderr. Raises RuntimeError (with the log's tail) if it does not start."""
        self.log = log
        with open(log or os.devnull, "ab") as stderr:  # the child keeps its own copy
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "herd.testing.simulator", "--host", host, "--port", "0",
                 *args],
                env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                # Ctrl-C in the terminal reaches the caller, which stops this in its turn.
                start_new_session=True,
            )  # fmt: skip
        assert self.popen.stdout is not None
        ready, _, _ = select.select([self.popen.stdout], [], [], timeout)
        line = self.popen.stdout.readline().decode().strip() if ready else ""
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the simulator did not start ({line!r}): {self._tail()}")
        self.url = line

    def _tail(self, lines: int = 30) -> str:
        if self.log is None:
            return "no log kept"
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"no {self.log}"

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` s."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        if self.popen.stdout is not None:
            self.popen.stdout.close()

    def __enter__(self) -> SimulatorProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
