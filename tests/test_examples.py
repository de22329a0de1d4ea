"""The examples the docs point to run as written, on a new HERD_HOME each."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A temporary folder with a short path: the example's HERD_HOME holds the embedded
    server's Unix socket, whose path may not pass 107 bytes (pytest's tmp_path under
    xdist is too long for it)."""
    folder = Path(tempfile.mkdtemp(prefix="herd-ex-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(300)
def test_the_pipeline_example_runs_to_its_last_line(short_tmp):
    """examples/pipeline/run.sh (docs/pipelines.md's one command): its plan, the batch,
    a stage's first answers and the results, exit 0. It once ended after the stage's
    answers: `| head` closed the pipe and pipefail stopped the script."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERD_", "OPENAI_"))}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               PORT=str(_free_port()), TMPDIR=str(short_tmp))  # fmt: skip
    r = subprocess.run(["bash", str(ROOT / "examples/pipeline/run.sh")], capture_output=True,
                       text=True, env=env, timeout=280)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "nothing enqueued or paid" in r.stdout  # the plan
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [x["stage"] for x in lines[:3]] == ["registers"] * 3
    assert lines[-1]["status"] == "done" and lines[-1]["source"] == "pipeline"
