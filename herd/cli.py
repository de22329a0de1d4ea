"""The `herd` command. Results go to stdout, logs and progress to stderr.

Exit codes: 0 success, 1 the work failed (what failed is named on stderr), 2 a usage
error; `herd eval submit --wait` and `herd eval wait` add 3 (parked) and 130;
141 when the reader of stdout closed it early (`| head`).
"""

from __future__ import annotations

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
from herd.config import Settings, check_database_url, parse_duration
from herd.console import (
    Group,
    Options,
    count,
    err,
    jsonable,
    listing,
    mask_logs,
    moment,
    opts,
    out,
    print_json,
    run,
    short,
)
from herd.errors import ConfigError, FallbackWarning
from herd.queue.base import Job, JobStatus
from herd.queue.registry import BROKERS
from herd.schedule.cli import schedule_cli

T = TypeVar("T")

JSON_HELP = "Print it as JSON."
JSON_LINES_HELP = "Print JSON lines, one per row."
_STATUSES = ", ".join(s.value for s in JobStatus)


EXIT_CODES = (
    "Exit codes: 0 success; 1 the work failed, or part of it (what failed is named on"
    " stderr); 2 a usage error (nothing was done). `herd eval submit --wait` and"
    " `herd eval wait` add 3 (the batch is parked) and 130 (interrupted). 141: the"
    " reader of stdout closed it early (`| head`), as for a process SIGPIPE ended."
)

cli = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="herd: a crash-safe queue with fenced leases for expensive model work.",
    epilog=EXIT_CODES,
)
jobs_cli = typer.Typer(no_args_is_help=True, help="Inspect jobs.")
dlq_cli = typer.Typer(no_args_is_help=True, help="The dead-letter queue.")
cli.add_typer(jobs_cli, name="jobs")
cli.add_typer(dlq_cli, name="dlq")
cli.add_typer(schedule_cli, name="schedule")


def _add_feature_commands(command: str | None = None) -> None:
    """The commands of the evaluation, corpus and server modules: ``command``'s alone,
    when it is one of them, else all (for help, or an unknown command's suggestions)."""
    # Imported here, not above: they are most of a CLI call's import time (see main).
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


def _known_broker(name: str | None) -> str | None:
    # The choices are the registry's names: a job store registered there is offered here.
    if name is not None and name not in BROKERS:
        raise typer.BadParameter(f"{name!r} is not one of {', '.join(BROKERS)}")
    return name


@cli.callback()
def _root(
    ctx: typer.Context,
    database_url: Annotated[
        str | None,
        typer.Option(
            metavar="URL",
            help="PostgreSQL URL, postgresql://USER:PASSWORD@HOST:PORT/DB (env"
            " HERD_DATABASE_URL); default: an embedded server in --home.",
        ),
    ] = None,
    home: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="Data folder of the embedded server (env HERD_HOME)."),
    ] = None,
    broker: Annotated[
        str | None,
        typer.Option(
            callback=_known_broker,
            metavar="|".join(BROKERS),
            help="Where jobs live (env HERD_BROKER); default postgres.",
        ),
    ] = None,
    redis_url: Annotated[
        str | None,
        typer.Option(metavar="URL", help="Redis URL, redis://HOST:PORT (env HERD_REDIS_URL)."),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks and debug logs.")] = False,
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
        "broker": broker,
    }
    flags = {k: v for k, v in flags.items() if v is not None}
    try:
        settings = Settings.from_env().override(**flags)
        if settings.database_url:
            given = "--database-url" if database_url else "HERD_DATABASE_URL"
            check_database_url(settings.database_url, given)
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
    # pypdf warns about each malformed PDF; herd names the file it could not read, once.
    logging.getLogger("pypdf").setLevel(logging.ERROR if not debug else logging.DEBUG)
    mask_logs()
    if not sys.warnoptions:  # a fallback is logged as an error already: say it once
        warnings.filterwarnings("ignore", category=FallbackWarning)


def runs(job: Job) -> int:
    """How often the job was started: its failed attempts and stalls, and the run
    that is going on or succeeded (``attempts`` counts errors only)."""
    current = job.status in (JobStatus.PROCESSING, JobStatus.SUCCEEDED)
    return job.attempts + job.stalls + int(current)


def _print_jobs(jobs: list[Job], *, title: str, dead: bool = False) -> None:
    """One line of identifiers per job, its result or error on the lines below."""
    columns = ["id", "task", "queue", "runs"]
    columns += ["reason", "finished"] if dead else ["status", "created"]
    rows = []
    for j in jobs:
        cells = [str(j.id), j.task, j.queue, str(runs(j))]
        if dead:
            cells += [j.dead_reason or "", moment(j.finished_at)]
        else:
            cells += [j.status.value, moment(j.created_at)]
        if j.status == JobStatus.SUCCEEDED:
            text = "result: " + short(j.result, 200)
        else:
            text = short(j.last_error or "", 400)
        rows.append((cells, text))
    listing(title, columns, rows, right=("id", "runs"))


def _ids(ids: list[int]) -> str:
    return ", ".join(map(str, ids))


def child_env(o: Options) -> dict[str, str]:
    """The environment of a herd process this one starts: the root options given on
    the command line travel as the variables they stand for (else `herd --broker
    redis demo` would run its workers on PostgreSQL, where no job waits)."""
    env = dict(os.environ, HERD_HOME=str(o.settings.home))
    env.update({_FLAG_ENV[name]: str(value) for name, value in o.flags.items()})
    return env


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
            metavar="MODULE:APP", help="Your app; without it, herd's built-in tasks only."
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, metavar="N", help="Jobs run at once.")
    ] = 10,
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue",
            "-q",
            metavar="NAME",
            help="A queue to take jobs from; repeat it for more. Default: every queue of"
            " the app's tasks.",
        ),
    ] = None,
    grace: Annotated[
        float,
        typer.Option(metavar="SECONDS", help="Time running jobs get to finish after SIGTERM."),
    ] = 30.0,
    poll_interval: Annotated[
        float,
        typer.Option(min=0.01, metavar="SECONDS", help="Time between looks at empty queues."),
    ] = 1.0,
    exit_when_idle: Annotated[
        bool,
        typer.Option(
            "--exit-when-idle",
            help="Stop once nothing runs and nothing is due within 30 seconds (a parked "
            "batch's jobs are not waited for: they are named in the log).",
        ),
    ] = False,
    startup_wait: Annotated[
        float,
        typer.Option(
            min=0,
            metavar="SECONDS",
            help="How long to retry a job store that is unreachable at start.",
        ),
    ] = 30.0,
) -> None:
    """Run jobs until SIGTERM or SIGINT.

    A first signal stops claiming and gives running jobs --grace seconds; a second
    releases them at once (another worker takes them over).
    """
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
    queue: Annotated[
        str | None, typer.Option(metavar="NAME", help="Default: the task's own queue.")
    ] = None,
    priority: Annotated[
        int | None, typer.Option(metavar="N", help="Higher runs first; default the task's.")
    ] = None,
    dedup_key: Annotated[
        str | None,
        typer.Option(metavar="KEY", help="No second job with this key while one is active."),
    ] = None,
    delay: Annotated[
        float, typer.Option(min=0, metavar="SECONDS", help="Run it no sooner than this from now.")
    ] = 0.0,
    concurrency_key: Annotated[
        str | None,
        typer.Option(
            metavar="KEY", help="A tenant or user: its jobs run at most N at once, by turns."
        ),
    ] = None,
    max_running_per_key: Annotated[
        int | None,
        typer.Option(min=1, metavar="N", help="That N; default the task's, else 1."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Add one job."""
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise typer.BadParameter(f"payload is not JSON: {exc}", param_hint="PAYLOAD") from None
    result = run(
        opts(ctx),
        lambda a: a.enqueue(
            task,
            data,
            queue=queue,
            priority=priority,
            dedup_key=dedup_key,
            delay=delay,
            concurrency_key=concurrency_key,
            max_running_per_key=max_running_per_key,
        ),
    )
    if as_json:
        print_json(result)
    else:
        out.print(f"job {result.job_id}" + ("" if result.created else " (already queued)"))


@jobs_cli.command("stats")
def jobs_stats(
    ctx: typer.Context,
    by_key: Annotated[
        bool,
        typer.Option("--by-key", help="Running and waiting jobs per concurrency key."),
    ] = False,
    top: Annotated[
        int, typer.Option(min=1, max=1000, metavar="N", help="With --by-key: the N busiest.")
    ] = 20,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_LINES_HELP)] = False,
) -> None:
    """Jobs per queue and status."""
    if by_key:
        _key_stats(ctx, top, as_json)
        return
    stats = run(opts(ctx), lambda a: a.stats())
    if as_json:
        for s in stats:
            print_json(s)
        return
    table = Table(
        title="queues", title_justify="left", box=None, pad_edge=False, header_style="bold",
        collapse_padding=True,
    )  # fmt: skip
    # "running" for processing, as `herd status` says: the queue's name keeps the width.
    headers = {JobStatus.PROCESSING.value: "running"}
    for col in ("queue", *[s.value for s in JobStatus], "ready", "oldest wait"):
        table.add_column(
            headers.get(col, col), justify="left" if col == "queue" else "right",
            overflow="fold", min_width=5,
        )  # fmt: skip
    for s in stats:
        age = f"{s.oldest_ready_age:.1f}s" if s.oldest_ready_age is not None else ""
        table.add_row(s.queue, *[str(s.counts.get(st, 0)) for st in JobStatus], str(s.ready), age)
    out.print(table)


def _key_stats(ctx: typer.Context, top: int, as_json: bool) -> None:
    keys = run(opts(ctx), lambda a: a.key_stats(top))
    if as_json:
        for k in keys:
            print_json(k)
        return
    if not keys:
        out.print("no job with a concurrency key is running or waiting")
        return
    table = Table(
        title=f"busiest {count(len(keys), 'key')}", title_justify="left", box=None,
        pad_edge=False, header_style="bold", collapse_padding=True,
    )  # fmt: skip
    table.add_column("queue", overflow="fold")
    table.add_column("key", overflow="fold")
    for col in ("running", "limit", "waiting"):
        table.add_column(col, justify="right", min_width=5)
    for k in keys:
        limit = "none" if k.max_running is None else str(k.max_running)
        table.add_row(k.queue, k.key, str(k.running), limit, str(k.waiting))
    out.print(table)


@jobs_cli.command("list")
def jobs_list(
    ctx: typer.Context,
    status: Annotated[
        JobStatus | None,
        typer.Option(metavar="STATUS", help=f"Only jobs in this status: {_STATUSES}."),
    ] = None,
    queue: Annotated[str | None, typer.Option(metavar="NAME", help="Only this queue.")] = None,
    limit: Annotated[int, typer.Option(min=1, metavar="N", help="Jobs to show.")] = 50,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_LINES_HELP)] = False,
) -> None:
    """Recent jobs, newest first."""
    jobs = run(opts(ctx), lambda a: a.list_jobs(status=status, queue=queue, limit=limit))
    if as_json:
        for j in jobs:
            print_json(j)
    else:
        _print_jobs(jobs, title=count(len(jobs), "job"))


@jobs_cli.command("show")
def jobs_show(
    ctx: typer.Context,
    job_id: Annotated[int, typer.Argument(metavar="ID", help="The job's id.")],
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Everything about one job."""
    job = run(opts(ctx), lambda a: a.get_job(job_id))
    if as_json:
        print_json(job)
        return
    table = Table(show_header=False, title=f"job {job.id}", title_justify="left", box=None)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for key, value in jsonable(job).items():
        table.add_row(key, value if isinstance(value, str) else json.dumps(value))
        if key == "stalls":
            table.add_row("runs", str(runs(job)))
    out.print(table)


@dlq_cli.command("list")
def dlq_list(
    ctx: typer.Context,
    queue: Annotated[str | None, typer.Option(metavar="NAME", help="Only this queue.")] = None,
    limit: Annotated[int, typer.Option(min=1, metavar="N", help="Jobs to show.")] = 100,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_LINES_HELP)] = False,
) -> None:
    """Dead-lettered jobs with their reasons."""
    jobs = run(opts(ctx), lambda a: a.dead_letters(queue=queue, limit=limit))
    if as_json:
        for j in jobs:
            print_json(j)
    else:
        _print_jobs(jobs, title=count(len(jobs), "dead-lettered job"), dead=True)


@dlq_cli.command("requeue")
def dlq_requeue(
    ctx: typer.Context,
    job_ids: Annotated[
        list[int] | None, typer.Argument(metavar="ID", help="Dead-lettered jobs' ids.")
    ] = None,
    all_: Annotated[bool, typer.Option("--all", help="Requeue every dead-lettered job.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Send dead-lettered jobs back to their queue with fresh counters.

    Exit code 1 when a job was not requeued (each is named on stderr).
    """
    if bool(job_ids) == all_:
        raise typer.BadParameter("give job ids or --all (not both)")
    result = run(opts(ctx), lambda a: a.requeue(None if all_ else job_ids))
    done = result.requeued
    if as_json:
        print_json(result)
    else:
        out.print(f"requeued {count(len(done), 'job')}" + (f": {_ids(done)}" if done else ""))
    for c in result.skipped:
        err.print(
            f"herd: skipped job {c.job_id}: active job {c.held_by} holds its dedup key"
            f" {c.dedup_key!r}",
            soft_wrap=True,
        )
    missing = set(job_ids or []) - set(done) - {c.job_id for c in result.skipped}
    if missing:
        err.print(f"herd: not in the dead-letter queue: {_ids(sorted(missing))}", soft_wrap=True)
    if missing or result.skipped:
        raise typer.Exit(1)


@dlq_cli.command("purge")
def dlq_purge(
    ctx: typer.Context,
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than",
            metavar="AGE",
            help="Delete jobs dead-lettered longer ago than this: 30s, 15m, 7d.",
        ),
    ],
    queue: Annotated[
        str | None, typer.Option(metavar="NAME", help="Only this queue's dead letters.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
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
        typer.Option(
            "--vectors",
            help="Also the corpus index's and the semantic cache's (need pgvector).",
        ),
    ] = False,
) -> None:
    """Bring herd's tables up to date.

    Also done on connect, unless HERD_AUTO_MIGRATE=0.
    """

    async def work(a: App) -> list[int]:
        from herd.db.postgres import PLAIN_FEATURES, VECTOR_FEATURES, migrate_all

        # Each feature keeps its own migrations; the queue's, the locks', the caches' and
        # the ledger's all live in herd's database, whichever broker holds the jobs.
        features = PLAIN_FEATURES + (VECTOR_FEATURES if vectors else ())
        return await migrate_all(a.database_url(), features)

    applied = run(opts(ctx), work, open_store=False)
    out.print(f"schema is up to date ({len(applied)} migrations applied)")


@cli.command()
def config(
    ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False
) -> None:
    """The settings in force (secrets masked)."""
    values = {"version": __version__, **opts(ctx).settings.masked()}
    if as_json:
        print_json(values)
        return
    table = Table(show_header=False, box=None)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
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
    jobs: Annotated[int, typer.Option(min=1, metavar="N", help="How many jobs to enqueue.")] = 200,
    workers: Annotated[int, typer.Option(min=1, metavar="N", help="Worker processes to run.")] = 2,
    concurrency: Annotated[
        int, typer.Option(min=1, metavar="N", help="Jobs each worker runs at once.")
    ] = 8,
) -> None:
    """Run a demo batch of jobs on worker processes started here.

    Enqueues the jobs, runs the workers until the queue is empty and shows the results.

    Exit code 1 when a job did not succeed or a worker failed.
    """
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
    env = child_env(o)
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "herd",
                *(["--debug"] if o.debug else []),
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
    table = Table(title=f"first {min(8, len(done))} of {len(done)} jobs", title_justify="left",
                  box=None, pad_edge=False, header_style="bold")  # fmt: skip
    for col in ("id", "status", "runs", "words", "sha256", "worker"):
        table.add_column(col, no_wrap=col != "worker", overflow="fold")
    for j in done[:8]:
        r = j.result if isinstance(j.result, dict) else {}
        table.add_row(
            str(j.id),
            j.status.value,
            str(runs(j)),
            str(r.get("words", "")),
            str(r.get("sha256", "")),
            str(r.get("worker", "")),
        )
    out.print(table)
    per_worker: dict[str, int] = {}
    for j in done:
        if isinstance(j.result, dict):
            per_worker[j.result["worker"]] = per_worker.get(j.result["worker"], 0) + 1
    statuses = ", ".join(f"{n} {status}" for status, n in sorted(by_status.items()))
    shares = ", ".join(map(str, sorted(per_worker.values(), reverse=True)))
    out.print(
        f"{statuses}; {sum(1 for j in done if j.attempts)} retried; jobs per worker:"
        f" {shares}; {len(done) / elapsed:.0f} jobs/s including worker start-up"
    )
    failed = [j.id for j in done if j.status != JobStatus.SUCCEEDED]
    if failed:
        err.print(
            f"herd: {count(len(failed), 'job')} did not succeed: {_ids(failed[:20])}"
            + (" …" if len(failed) > 20 else "")
            + " (`herd jobs list` shows them)",
            soft_wrap=True,
        )
    for n, code in enumerate(codes):
        if code:
            err.print(f"herd: worker process {n + 1} exited with code {code}", soft_wrap=True)
    if any(codes) or failed:
        raise typer.Exit(1)


# Each root option's variable: what a herd process started by this one reads it from.
_FLAG_ENV = {
    "database_url": "HERD_DATABASE_URL",
    "home": "HERD_HOME",
    "broker": "HERD_BROKER",
    "redis_url": "HERD_REDIS_URL",
}

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
    args = sys.argv[1:]
    command = _command_of(args)
    # `herd --version` prints and exits before any command is looked up (an eager
    # option): it needs none of them, and had paid for all (1.1 s against 0.5 s).
    asks_version = command is None and "--version" in args
    if command not in _core_commands() and not asks_version:
        _add_feature_commands(command)
    cli(prog_name="herd")
