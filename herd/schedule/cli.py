"""`herd schedule …`: the stored schedules (next run, last run and its outcome), pause,
resume, run now. Works without the app that defines them: the store keeps them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from herd import console
from herd.schedule import ops

schedule_cli = typer.Typer(
    no_args_is_help=True, help="Periodic jobs: list, pause, resume, run now, remove."
)

Name = Annotated[str, typer.Argument(help="The schedule's name (`herd schedule list`).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _stamp(value: datetime | None) -> str:
    """Month, day and seconds: an every-3-seconds schedule's next run is seconds away."""
    return value.astimezone().strftime("%m-%d %H:%M:%S") if value else "-"


def _listing(views: list[ops.ScheduleView]) -> None:
    """A line of short cells a schedule (the name in full: pause and run-now take it),
    then when it fires and its last outcome on lines of their own, wrapped at 80."""
    rows = []
    for v in views:
        policy = f"catch_up {v.catch_up}" if v.policy == "catch_up" else v.policy
        detail = f"{v.when}, {policy}; task {v.task} on queue {v.queue}"
        if v.last_outcome:
            job = f" (job {v.last_job_id})" if v.last_job_id is not None else ""
            detail += f"\nlast run {v.last_outcome}{job}"
            if v.last_error:
                detail += f": {console.short(v.last_error, 120)}"
        cells = [v.name, "paused" if v.paused else "active", _stamp(v.next_run),
                 _stamp(v.last_run_at), str(v.runs)]  # fmt: skip
        rows.append((cells, detail))
    zone = datetime.now().astimezone().strftime("%Z")
    console.listing(f"{len(views)} schedules (times {zone})",
                    ["name", "state", "next run", "last run", "runs"], rows,
                    right=["runs"])  # fmt: skip


@schedule_cli.command("list")
def schedule_list(ctx: typer.Context, as_json: AsJson = False) -> None:
    """Every schedule, its next run and its last outcome.

    When it runs, next run, last run and its outcome, paused or not.
    """
    views = console.run(console.opts(ctx), ops.views)
    if as_json:
        for v in views:
            console.print_json(v)
        return
    if not views:
        console.out.print("no schedules yet: a worker of an app with @app.periodic stores them")
        return
    _listing(views)


@schedule_cli.command("pause")
def schedule_pause(ctx: typer.Context, name: Name, as_json: AsJson = False) -> None:
    """Stop firing the schedule's ticks (on every worker) until resumed."""
    view = console.run(console.opts(ctx), lambda app: ops.pause(app, name))
    _said(view, f"paused {name}", as_json)


@schedule_cli.command("resume")
def schedule_resume(ctx: typer.Context, name: Name, as_json: AsJson = False) -> None:
    """Fire the schedule's ticks again from the next one.

    The ticks that fell while it was paused are dropped.
    """
    view = console.run(console.opts(ctx), lambda app: ops.resume(app, name))
    _said(view, f"resumed {name}: next run {console.when(view.next_run)}", as_json)


@schedule_cli.command("run-now")
def schedule_run_now(ctx: typer.Context, name: Name, as_json: AsJson = False) -> None:
    """Enqueue one run now (paused or not); no tick is used up."""
    job_id = console.run(console.opts(ctx), lambda app: ops.run_now(app, name))
    if as_json:
        console.print_json({"schedule": name, "job_id": job_id})
    else:
        console.out.print(f"enqueued job {job_id} for schedule {name}")


@schedule_cli.command("remove")
def schedule_remove(ctx: typer.Context, name: Name, as_json: AsJson = False) -> None:
    """Forget a schedule that no app defines any more.

    A worker of an app that still defines it registers it again.
    """
    view = console.run(console.opts(ctx), lambda app: ops.remove(app, name))
    _said(view, f"removed {name}", as_json)


def _said(view: ops.ScheduleView, text: str, as_json: bool) -> None:
    if as_json:
        console.print_json(view)
    else:
        console.out.print(text)
