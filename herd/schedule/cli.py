"""`herd schedule …`: the stored schedules (next run, last run and its outcome), pause,
resume, run now. Works without the app that defines them: the store keeps them."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from herd import console
from herd.schedule import ops

schedule_cli = typer.Typer(
    no_args_is_help=True, help="Periodic jobs: list, pause, resume, run now, remove."
)

Name = Annotated[str, typer.Argument(help="The schedule's name (`herd schedule list`).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _table(views: list[ops.ScheduleView]) -> Table:
    table = Table(
        title=f"{len(views)} schedules", title_justify="left", box=None, pad_edge=False,
        header_style="bold", collapse_padding=True,
    )  # fmt: skip
    # The policy shares the when column: nine columns leave "runs" no room at 80.
    for col in ("name", "task (queue)", "when", "state", "next run", "last run", "outcome",
                "runs"):  # fmt: skip
        # Folded, never cut with "…": the name is what pause and run-now take.
        table.add_column(
            col, justify="right" if col == "runs" else "left", overflow="fold",
            no_wrap=col in ("name", "state", "runs"),
        )  # fmt: skip
    for v in views:
        policy = f"catch_up {v.catch_up}" if v.policy == "catch_up" else v.policy
        outcome = v.last_outcome or ""
        if v.last_job_id is not None:
            outcome = f"{outcome} (job {v.last_job_id})"
        if v.last_error:
            outcome += f": {console.short(v.last_error, 40)}"
        table.add_row(
            v.name, f"{v.task} ({v.queue})", f"{v.when}, {policy}",
            "paused" if v.paused else "active",
            console.when(v.next_run), console.when(v.last_run_at), outcome, str(v.runs),
        )  # fmt: skip
    return table


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
    console.out.print(_table(views))


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
