"""The `herd` command read at 80 columns: every command's --help and the listings a
user reads most, checked against the rules of docs/usage.md ("Reading the command
line"): no line over 80 columns, no type noise (`<bool>`, `TEXT`), no stray " .",
no Python reprs, one `herd: error:` line for a usage error."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from herd import App
from herd import cli as herd_cli
from herd.durations import duration
from herd.llm.eval import EvalRuntime
from herd.queue.base import Completion, DeadReason, Failure
from herd.queue.postgres import PostgresBroker
from tests.conftest import flush_redis
from tests.helpers import job
from tests.test_cli import ROOT, herd

WIDTH = 80
# Types typer or click would print where a metavar says nothing: `<bool>`, `<list[str]>`,
# `<int range>`, TEXT, INTEGER.
TYPE_NOISE = re.compile(r"<[a-z][\w \[\]|.,]*>|\b(TEXT|INTEGER|FLOAT|BOOLEAN|PATH RANGE)\b")
# What Python prints for its own objects: a dataclass, a dict, a list of numbers.
REPR = re.compile(r"\b[A-Z]\w+\(\w+=|\{'\w+': |\[\d+(, \d+)*\]")
STRAY_DOT = re.compile(r"\s\.(\s|$)")

herd_cli._add_feature_commands(None)
runner = CliRunner()


def _command_paths() -> list[list[str]]:
    """Every command and group, as the words a user types."""
    found: list[list[str]] = [[]]

    def walk(command: Any, path: list[str]) -> None:
        for name, sub in getattr(command, "commands", {}).items():
            found.append([*path, name])
            walk(sub, [*path, name])

    walk(get_command(herd_cli.cli), [])
    return found


def _invoke(*args: str) -> Any:
    return runner.invoke(herd_cli.cli, list(args), env={"COLUMNS": str(WIDTH)}, prog_name="herd")


def _wide(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > WIDTH]


def test_every_commands_help_fits_80_columns_without_type_noise_or_stray_dots():
    paths = _command_paths()
    assert len(paths) > 25  # the feature commands are there too
    for path in paths:
        r = _invoke(*path, "--help")
        assert r.exit_code == 0, (path, r.output)
        text = r.stdout
        assert not _wide(text), (path, _wide(text))
        assert not TYPE_NOISE.search(text), (path, TYPE_NOISE.search(text), text)
        assert not STRAY_DOT.search(text), (path, text)
        # A command's line in its group's list is its help's first sentence, whole.
        cut = [line for line in text.splitlines() if line.endswith("...") and "Usage:" not in line]
        assert not cut, (path, cut)
        assert "╭" not in text and "│" not in text, (path, text)  # no boxes
        assert "Usage: herd" in text, (path, text)


def test_every_option_has_a_long_form_and_help():
    def walk(command: Any, path: str) -> None:
        for param in command.params:
            if param.param_type_name != "option" or param.name == "help":
                continue
            assert any(o.startswith("--") for o in param.opts), (path, param.opts)
            assert (param.help or "").strip(), (path, param.opts)
            # Valued options say what value: a metavar of the code's choosing.
            if not param.is_flag:
                assert param.metavar and param.metavar.isupper() or "|" in param.metavar, (
                    path,
                    param.opts,
                    param.metavar,
                )
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(get_command(herd_cli.cli), "herd")


def test_the_exit_codes_are_listed_in_the_help():
    text = _invoke("--help").stdout
    assert "Exit codes: 0 success; 1 the work failed" in " ".join(text.split())
    assert "141: the reader of stdout closed it early" in " ".join(text.split())
    submit = " ".join(_invoke("eval", "submit", "--help").stdout.split())
    assert "Exit codes: 0 every document answered" in submit


# A command that prints far more than a pipe holds, through either writer herd uses.
_TALKER = """
import sys, typer
from herd.console import Group, out, print_json
cli = typer.Typer(cls=Group)
@cli.command()
def talk(how: str) -> None:
    for i in range(200_000):
        out.print(f"line {i}") if how == "rich" else print_json({"line": i})
@cli.command()
def other() -> None: ...
cli()
"""


@pytest.mark.parametrize("how", ["rich", "json"])
def test_a_reader_that_closes_stdout_early_ends_the_command_quietly_with_141(how):
    # `herd eval results | head`: not exit 1 (the work failed), no traceback.
    p = subprocess.Popen(
        [sys.executable, "-c", _TALKER, "talk", how],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert p.stdout is not None and p.stderr is not None
    assert p.stdout.readline().startswith((b"line 0", b'{"line": 0}'))
    p.stdout.close()
    assert p.wait(timeout=60) == 141
    assert p.stderr.read() == b""


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["jobs", "show", "abc"], "Invalid value for 'ID'"),
        (["enqueue"], "Missing argument 'TASK'"),
        (["no-such-command"], "No such command 'no-such-command'"),
        (["worker", "--concurrency", "0"], "'--concurrency'"),
        (["dlq", "requeue"], "give job ids or --all"),
    ],
)
def test_a_usage_error_is_one_line_with_one_error_prefix(args, says):
    r = _invoke(*args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("herd: error: ") and lines[0].count("rror") == 1, lines[0]
    assert says in lines[0] and "--help" in lines[0], lines[0]
    assert r.stdout == ""


def test_a_group_without_its_command_prints_its_help_and_exits_2():
    r = _invoke("jobs")
    assert r.exit_code == 2 and r.stderr == ""
    assert r.stdout.startswith("Usage: herd jobs [OPTIONS] COMMAND [ARGS]...")
    assert not _wide(r.stdout) and "╭" not in r.stdout


def test_a_malformed_database_url_says_what_is_wrong_and_the_form_expected():
    r = herd("jobs", "list", HERD_DATABASE_URL="notaurl")
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("herd: error: HERD_DATABASE_URL is not a PostgreSQL URL: 'notaurl'")
    assert "expected postgresql://USER:PASSWORD@HOST:PORT/DATABASE" in line
    assert "connection info string" not in line
    r = herd("--database-url", "mysql://u:s3cret@h/db", "config")
    assert r.returncode == 2 and "--database-url is a mysql:// URL" in r.stderr, r.stderr
    assert "s3cret" not in r.stderr


LONG_ERROR = (
    "the provider refused the request: model 'sim-1' is not available to this key;"
    " ask the account's owner to enable it, or pick another model with --model, then"
    " run `herd eval resume` for the batch that was parked"
)


async def _seed(url: str) -> None:
    broker = PostgresBroker(url)
    await broker.open()
    try:
        await broker.enqueue([job(task="herd.eval.evaluate", queue="a-long-queue-name-of-a-batch")])
        (lease,) = await broker.claim(["a-long-queue-name-of-a-batch"], "w", 1)
        await broker.fail_if_leased(Failure(lease, LONG_ERROR, final=True, reason=DeadReason.FATAL))
        await broker.enqueue([job(task="t", payload={"n": 1})])
        (lease,) = await broker.claim(["default"], "w", 1)
        await broker.complete_if_leased([Completion(lease, {"answer": 42})])
    finally:
        await broker.close()
    async with App(database_url=url) as app:  # a lookup in the exact cache: a row to show
        cache = (await EvalRuntime.of(app)).cache

        async def compute() -> dict[str, int]:
            return {"score": 7}

        await cache.get_or_compute(uuid.uuid4().hex, compute)


def _check_output(text: str, what: str) -> None:
    assert not _wide(text), (what, _wide(text))
    assert not REPR.search(text), (what, REPR.search(text), text)
    assert "┃" not in text, (what, text)  # a box costs a third of the width
    padded = [line for line in text.splitlines() if line.endswith(" ")]
    assert not padded, (what, padded)  # a table's padding is not data


def test_listings_at_80_columns_fold_the_error_and_show_no_reprs(clean_pg):
    asyncio.run(_seed(clean_pg))
    dlq = herd("dlq", "list", url=clean_pg, COLUMNS="80")
    assert dlq.returncode == 0, dlq.stderr
    _check_output(dlq.stdout, "dlq list")
    lines = dlq.stdout.splitlines()
    # The reason is a word, the error a paragraph of full lines beneath its job.
    header = next(line for line in lines if line.startswith("id"))
    assert header.split() == ["id", "task", "queue", "runs", "reason", "finished"]
    row = lines[lines.index(header) + 1].split()
    assert row[1:5] == ["herd.eval.evaluate", "a-long-queue-name-of-a-batch", "1", "fatal"]
    error = [line.strip() for line in lines[lines.index(header) + 2 :]]
    assert " ".join(error) == LONG_ERROR
    assert len(error) <= len(LONG_ERROR) // 60 + 1, error  # not a word a line

    listed = herd("jobs", "list", url=clean_pg, COLUMNS="80")
    _check_output(listed.stdout, "jobs list")
    # A job that succeeded at its first try ran once.
    done = next(line for line in listed.stdout.splitlines() if " t " in line)
    assert done.split()[3:5] == ["1", "succeeded"], done
    assert 'result: {"answer": 42}' in listed.stdout

    stats = herd("jobs", "stats", url=clean_pg, COLUMNS="80")
    assert stats.returncode == 0, stats.stderr
    _check_output(stats.stdout, "jobs stats")
    assert "a-long-queue-name-of-a-batch" in stats.stdout  # whole, not cut to "a-lo…"

    cache = herd("cache", "stats", url=clean_pg, COLUMNS="80")
    assert cache.returncode == 0, cache.stderr
    _check_output(cache.stdout, "cache stats")
    assert "…" not in cache.stdout
    head = cache.stdout.splitlines()[1].split()
    assert head == ["namespace", "entries", "hits", "misses", "computed", "waited", "stale",
                    "early", "errors"]  # fmt: skip


def test_requeue_names_the_jobs_in_words(clean_pg):
    asyncio.run(_seed(clean_pg))
    (dead,) = [json.loads(line)["id"] for line in herd("dlq", "list", "--json", url=clean_pg)
               .stdout.splitlines()]  # fmt: skip
    r = herd("dlq", "requeue", str(dead), "999999", url=clean_pg)
    assert r.returncode == 1
    assert r.stdout == f"requeued 1 job: {dead}\n"
    assert r.stderr == "herd: not in the dead-letter queue: 999999\n"


def test_the_root_options_reach_the_workers_demo_starts(pg_url, redis_stack):
    # --broker and --redis-url given as options only: the worker processes must get
    # them too, or they wait on PostgreSQL while the jobs sit in Redis.
    flush_redis(redis_stack)
    r = herd("--broker", "redis", "--redis-url", redis_stack, "demo", "--jobs", "4",
             "--workers", "1", url=pg_url, COLUMNS="80")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 succeeded; " in r.stdout, r.stdout
    _check_output(r.stdout, "demo")


def test_a_normal_sigterm_is_logged_at_info_and_the_stats_in_words(clean_pg):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
    environ.update(PYTHONPATH=str(ROOT), HERD_DATABASE_URL=clean_pg)
    proc = subprocess.Popen(
        [sys.executable, "-m", "herd", "worker", "--poll-interval", "0.1"],
        env=environ,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # until the worker says it runs: then it handles signals
            seen.append(line)
            if "herd.worker: worker " in line and "queues" in line:
                break
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, "".join(seen) + rest
    said = [line for line in rest.splitlines() if "SIGTERM: no new jobs" in line]
    assert len(said) == 1 and " INFO " in said[0], rest
    assert " WARNING " not in rest, rest
    stopped = next(line for line in rest.splitlines() if " stopped: " in line)
    assert stopped.endswith("stopped: no jobs"), stopped  # not WorkerStats(claimed=0, ...)


def test_one_duration_format_for_every_surface():
    assert [duration(s) for s in (0, 0.2, 45, 89.6, 185, 5399, 7500)] == [
        "0 s", "1 s", "45 s", "1 min 30 s", "3 min 05 s", "89 min 59 s", "2 h 05 min",
    ]  # fmt: skip
    assert [duration(s, compact=True) for s in (4.46, 185, 7560, -3.2)] == [
        "4.5s", "3m 05s", "2.1h", "-3.2s",
    ]  # fmt: skip
