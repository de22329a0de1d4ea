"""The `herd` command. Results go to stdout, logs and progress to stderr.

Exit codes: 0 success, 1 the work failed, 2 a usage error.
"""

from __future__ import annotations

import enum
import importlib
import json
import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from herd._version import __version__
from herd.app import App
from herd.config import Settings, parse_duration
from herd.console import (
    Options,
    err,
    jsonable,
    mask_logs,
    opts,
    out,
    print_json,
    run,
    short,
    when,
)
from herd.errors import ConfigError, FallbackWarning
from herd.queue.base import Job, JobStatus
from herd.schedule.cli import schedule_cli

T = TypeVar("T")


class Broker(enum.StrEnum):
    postgres = "postgres"
    redis = "redis"


cli = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="herd: a crash-safe queue with fenced leases for expensive model work.",
)
jobs_cli = typer.Typer(no_args_is_help=True, help="Inspect jobs.")
dlq_cli = typer.Typer(no_args_is_help=True, help="The dead-letter queue.")
cli.add_typer(jobs_cli, name="jobs")
cli.add_typer(dlq_cli, name="dlq")
cli.add_typer(schedule_cli, name="schedule")


def _add_feature_commands(command: str | None = None) -> None:
    """The commands of the evaluation, corpus and server modules: ``command``'s alone,
    when it is one of them, else all (for help, or an unknown command's suggestions)."""
    # Imported here: the feature modules import this one for its helpers.
    if command in (None, "eval", "cache") or command not in _FEATURES:
        from herd.cache.cli import cache_cli
        from herd.llm.cli import eval_cli

        cli.add_typer(eval_cli, name="eval")
        cli.add_typer(cache_cli, name="cache")
    if command in (None, "ingest", "query") or command not in _FEATURES:
        from herd.rag.cli import ingest, query

        cli.command()(ingest)
        cli.command()(query)
    if command in (None, "serve", "status") or command not in _FEATURES:
        from herd.api.cli import serve, status

        cli.command()(serve)
        cli.command()(status)


_FEATURES = frozenset({"eval", "cache", "ingest", "query", "serve", "status"})


def _print_version(value: bool) -> None:
    if value:
        out.print(f"herd {__version__}")
        raise typer.Exit()


@cli.callback()
def _root(
    ctx: typer.Context,
    database_url: Annotated[
        str | None,
        typer.Option(help="PostgreSQL URL [env HERD_DATABASE_URL; default: the embedded server]"),
    ] = None,
    home: Annotated[
        Path | None, typer.Option(help="Data folder for the embedded server [env HERD_HOME]")
    ] = None,
    broker: Annotated[
        Broker | None, typer.Option(help="Where jobs live [env HERD_BROKER; default postgres]")
    ] = None,
    redis_url: Annotated[str | None, typer.Option(help="Redis URL [env HERD_REDIS_URL]")] = None,
    debug: Annotated[bool, typer.Option(help="Show tracebacks and debug logs.")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print herd's version."
        ),
    ] = False,
) -> None:
    flags: dict[str, Any] = {
        "database_url": database_url,
        "home": home,
        "redis_url": redis_url,
        "broker": broker.value if broker else None,
    }
    flags = {k: v for k, v in flags.items() if v is not None}
    try:
        settings = Settings.from_env().override(**flags)
    except ConfigError as exc:  # a bad HERD_* variable: one line, not a traceback
        err.print(f"herd: error: {exc}", soft_wrap=True)
        raise typer.Exit(2) from None
    ctx.obj = Options(settings, flags, debug)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    # herd's own progress at INFO; libraries (onnxruntime's quantizer logs to the
    # root logger) only when something is wrong.
    logging.getLogger("herd").setLevel(logging.DEBUG if debug else logging.INFO)
    # The pool logs every failed reconnect; herd reports outages itself, once.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR if not debug else logging.DEBUG)
    mask_logs()
    if not sys.warnoptions:  # a fallback is logged as an error already: say it once
        warnings.filterwarnings("ignore", category=FallbackWarning)


def _jobs_table(jobs: list[Job], *, title: str, dead: bool = False) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("id", "task", "queue", "status", "prio", "tries", "stalls"):
        table.add_column(
            col, justify="right" if col in ("id", "prio", "tries", "stalls") else "left"
        )
    table.add_column("reason / last error" if dead else "result / error")
    table.add_column("finished" if dead else "created")
    for j in jobs:
        detail = (
            f"{j.dead_reason}: {j.last_error}"
            if j.status == JobStatus.DEAD
            else (short(j.result) if j.status == JobStatus.SUCCEEDED else (j.last_error or ""))
        )
        table.add_row(
            str(j.id),
            j.task,
            j.queue,
            j.status.value,
            str(j.priority),
            str(j.attempts),
            str(j.stalls),
            short(detail),
            when(j.finished_at if dead else j.created_at),
        )
    return table


# -- worker


def load_app(spec: str) -> App:
    """Import ``module:attribute`` (the current folder is importable)."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise typer.BadParameter("expected MODULE:APP, e.g. myproject.tasks:app")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise typer.BadParameter(f"cannot import {module_name!r}: {exc}") from None
    app = getattr(module, attr or "app", None)
    if not isinstance(app, App):
        raise typer.BadParameter(f"{spec!r} is not a herd.App")
    return app


@cli.command()
def worker(
    ctx: typer.Context,
    app_spec: Annotated[
        str | None,
        typer.Argument(
            metavar="[MODULE:APP]", help="Your app; without it, herd's built-in tasks only."
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1)] = 10,
    queue: Annotated[
        list[str] | None,
        typer.Option("--queue", "-q", help="Repeatable [default: every queue of the app's tasks]."),
    ] = None,
    grace: Annotated[float, typer.Option(help="Seconds running jobs get after SIGTERM.")] = 30.0,
    poll_interval: Annotated[float, typer.Option(min=0.01)] = 1.0,
    exit_when_idle: Annotated[bool, typer.Option(help="Stop once the queues are empty.")] = False,
    startup_wait: Annotated[
        float,
        typer.Option(min=0, help="Seconds to retry a job store that is unreachable at start."),
    ] = 30.0,
) -> None:
    """Run jobs until SIGTERM/SIGINT (a second signal releases running jobs at once)."""
    from herd.builtin import tasks as builtin_tasks
    from herd.worker import Worker

    o = opts(ctx)
    app = load_app(app_spec) if app_spec else App(settings=o.settings)
    if app_spec:
        app.settings = app.settings.override(**o.flags)
    app.include(builtin_tasks)
    app.pool_size(concurrency)  # before run() opens the app and its broker's pool

    async def work(a: App) -> Any:
        return await Worker(
            a,
            queues=queue
            or sorted(
                {"default", *(t.queue for t in app.tasks.values())}
                | {s.queue for s in app.schedules.values()}
            ),
            concurrency=concurrency,
            grace_period=grace,
            poll_interval=poll_interval,
            stop_when_idle=exit_when_idle,
        ).run()

    run(o, work, app, open_wait=startup_wait)


# -- jobs


@cli.command()
def enqueue(
    ctx: typer.Context,
    task: Annotated[str, typer.Argument(help="Task name.")],
    payload: Annotated[str, typer.Argument(help="JSON payload.")] = "{}",
    queue: Annotated[str | None, typer.Option()] = None,
    priority: Annotated[int | None, typer.Option()] = None,
    dedup_key: Annotated[str | None, typer.Option()] = None,
    delay: Annotated[float, typer.Option(min=0)] = 0.0,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Add one job."""
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise typer.BadParameter(f"payload is not JSON: {exc}", param_hint="PAYLOAD") from None
    result = run(
        opts(ctx),
        lambda a: a.enqueue(
            task, data, queue=queue, priority=priority, dedup_key=dedup_key, delay=delay
        ),
    )
    if as_json:
        print_json(result)
    else:
        out.print(f"job {result.job_id}" + ("" if result.created else " (already queued)"))


@jobs_cli.command("stats")
def jobs_stats(
    ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """Jobs per queue and status."""
    stats = run(opts(ctx), lambda a: a.stats())
    if as_json:
        for s in stats:
            print_json(s)
        return
    table = Table(title="queues", title_justify="left")
    for col in ("queue", *[s.value for s in JobStatus], "ready", "oldest ready"):
        table.add_column(col, justify="left" if col == "queue" else "right")
    for s in stats:
        age = f"{s.oldest_ready_age:.1f}s" if s.oldest_ready_age is not None else ""
        table.add_row(s.queue, *[str(s.counts.get(st, 0)) for st in JobStatus], str(s.ready), age)
    out.print(table)


@jobs_cli.command("list")
def jobs_list(
    ctx: typer.Context,
    status: Annotated[JobStatus | None, typer.Option()] = None,
    queue: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option(min=1)] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Recent jobs, newest first."""
    jobs = run(opts(ctx), lambda a: a.list_jobs(status=status, queue=queue, limit=limit))
    if as_json:
        for j in jobs:
            print_json(j)
    else:
        out.print(_jobs_table(jobs, title=f"{len(jobs)} jobs"))


@jobs_cli.command("show")
def jobs_show(
    ctx: typer.Context, job_id: int, as_json: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """Everything about one job."""
    job = run(opts(ctx), lambda a: a.get_job(job_id))
    if as_json:
        print_json(job)
        return
    table = Table(show_header=False, title=f"job {job.id}", title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in jsonable(job).items():
        table.add_row(key, value if isinstance(value, str) else json.dumps(value))
    out.print(table)


@dlq_cli.command("list")
def dlq_list(
    ctx: typer.Context,
    queue: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option(min=1)] = 100,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Dead-lettered jobs with their reasons."""
    jobs = run(opts(ctx), lambda a: a.dead_letters(queue=queue, limit=limit))
    if as_json:
        for j in jobs:
            print_json(j)
    else:
        out.print(_jobs_table(jobs, title=f"{len(jobs)} dead-lettered jobs", dead=True))


@dlq_cli.command("requeue")
def dlq_requeue(
    ctx: typer.Context,
    job_ids: Annotated[list[int] | None, typer.Argument(metavar="[ID]...")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Requeue every dead-lettered job.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Send dead-lettered jobs back to their queue with fresh counters."""
    if bool(job_ids) == all_:
        raise typer.BadParameter("give job ids or --all (not both)")
    result = run(opts(ctx), lambda a: a.requeue(None if all_ else job_ids))
    done = result.requeued
    if as_json:
        print_json(result)
    else:
        out.print(f"requeued {len(done)} jobs" + (f": {done}" if done else ""))
    for c in result.skipped:
        err.print(
            f"herd: skipped job {c.job_id}: active job {c.held_by} holds its dedup key"
            f" {c.dedup_key!r}",
            soft_wrap=True,
        )
    missing = set(job_ids or []) - set(done) - {c.job_id for c in result.skipped}
    if missing:
        err.print(f"not in the dead-letter queue: {sorted(missing)}")
    if missing or result.skipped:
        raise typer.Exit(1)


@dlq_cli.command("purge")
def dlq_purge(
    ctx: typer.Context,
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than", help="Delete jobs dead-lettered longer ago than this: 30s, 15m, 7d."
        ),
    ],
    queue: Annotated[str | None, typer.Option(help="Only this queue's dead letters.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Delete dead-lettered jobs for good (nothing else removes them)."""
    try:
        seconds = parse_duration(older_than, "--older-than")
    except ConfigError as exc:
        err.print(f"herd: error: {exc}", soft_wrap=True)
        raise typer.Exit(2) from None
    removed = run(opts(ctx), lambda a: a.purge_dead(seconds, queue))
    if as_json:
        print_json({"purged": removed})
    else:
        out.print(f"purged {removed} dead-lettered jobs")


@cli.command()
def migrate(
    ctx: typer.Context,
    vectors: Annotated[
        bool,
        typer.Option(help="Also the corpus index's and the semantic cache's (need pgvector)."),
    ] = False,
) -> None:
    """Bring herd's tables up to date (also done on connect unless HERD_AUTO_MIGRATE=0)."""

    async def work(a: App) -> list[int]:
        from herd.db.postgres import PLAIN_FEATURES, VECTOR_FEATURES, migrate_all

        # Each feature keeps its own migrations; the queue's, the locks', the caches' and
        # the ledger's all live in herd's database, whichever broker holds the jobs.
        features = PLAIN_FEATURES + (VECTOR_FEATURES if vectors else ())
        return await migrate_all(a.database_url(), features)

    applied = run(opts(ctx), work, open_store=False)
    out.print(f"schema is up to date ({len(applied)} migrations applied)")


@cli.command()
def config(ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The settings in force (secrets masked)."""
    values = {"version": __version__, **opts(ctx).settings.masked()}
    if as_json:
        print_json(values)
        return
    table = Table(show_header=False)
    for key, value in values.items():
        table.add_row(key, value)
    out.print(table)


# -- demo

_DEMO_TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "Setiap orang berhak atas pekerjaan dan penghidupan yang layak bagi kemanusiaan.",
    "A lease that is not renewed expires, and another worker takes the job over.",
    "No token is paid for twice and no result is lost.",
]


@cli.command()
def demo(
    ctx: typer.Context,
    jobs: Annotated[int, typer.Option(min=1, help="How many jobs to enqueue.")] = 200,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes to run.")] = 2,
    concurrency: Annotated[int, typer.Option(min=1)] = 8,
) -> None:
    """Enqueue a batch of jobs, run worker processes until it is done, show the results."""
    o = opts(ctx)
    batch = f"demo-{int(time.time())}"
    payloads = [
        {
            "text": f"{_DEMO_TEXTS[i % len(_DEMO_TEXTS)]} (#{i})",
            "flaky": i % 50 == 7,
            "batch": batch,
        }
        for i in range(jobs)
    ]

    async def submit(a: App) -> list[int]:
        res = await a.enqueue_many("herd.demo.fingerprint", payloads, queue=batch)
        return [r.job_id for r in res]

    ids = run(o, submit)
    err.print(f"enqueued {len(ids)} jobs on queue {batch}; starting {workers} worker processes")
    env = dict(os.environ, HERD_HOME=str(o.settings.home))
    if o.settings.database_url:
        env["HERD_DATABASE_URL"] = o.settings.database_url
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "herd",
                "worker",
                "--queue",
                batch,
                "--concurrency",
                str(concurrency),
                "--exit-when-idle",
                "--poll-interval",
                "0.2",
            ],
            env=env,
        )
        for _ in range(workers)
    ]
    codes = [p.wait() for p in procs]
    elapsed = time.monotonic() - started

    async def collect(a: App) -> list[Job]:
        return [await a.get_job(i) for i in ids]

    done = run(o, collect)
    by_status: dict[str, int] = {}
    for j in done:
        by_status[j.status.value] = by_status.get(j.status.value, 0) + 1
    table = Table(title=f"first {min(8, len(done))} of {len(done)} jobs", title_justify="left")
    for col in ("id", "status", "tries", "words", "sha256", "worker"):
        table.add_column(col)
    for j in done[:8]:
        r = j.result if isinstance(j.result, dict) else {}
        table.add_row(
            str(j.id),
            j.status.value,
            str(j.attempts),
            str(r.get("words", "")),
            str(r.get("sha256", "")),
            str(r.get("worker", "")),
        )
    out.print(table)
    per_worker: dict[str, int] = {}
    for j in done:
        if isinstance(j.result, dict):
            per_worker[j.result["worker"]] = per_worker.get(j.result["worker"], 0) + 1
    out.print(
        f"status: {by_status}; retried: {sum(1 for j in done if j.attempts)}; "
        f"jobs per worker: {sorted(per_worker.values(), reverse=True)}; "
        f"{len(done) / elapsed:.0f} jobs/s including worker start-up"
    )
    if any(codes) or by_status.get("succeeded", 0) != len(done):
        raise typer.Exit(1)


# The root options that take a value: the word after one is not a command.
_VALUED = frozenset({"--database-url", "--home", "--broker", "--redis-url"})


def _command_of(argv: list[str]) -> str | None:
    after_option = False
    for arg in argv:
        if after_option:
            after_option = False
        elif arg in _VALUED:
            after_option = True
        elif not arg.startswith("-"):
            return arg
    return None


def _core_commands() -> set[str]:
    names = {c.name or (c.callback.__name__ if c.callback else "") for c in cli.registered_commands}
    return {n.replace("_", "-") for n in names} | {g.name or "" for g in cli.registered_groups}


def main() -> None:
    # The evaluation, corpus and server commands import much of herd (about a second
    # of a CLI call): only a call that may need them, or lists them, pays for it.
    command = _command_of(sys.argv[1:])
    if command not in _core_commands():
        _add_feature_commands(command)
    cli()
