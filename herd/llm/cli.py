"""`herd eval …`: submit a batch of documents, follow it, read it back, steer it."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.table import Table

from herd import console
from herd.app import App
from herd.errors import InvalidInput
from herd.llm import follow
from herd.llm.eval import (
    EvalRuntime,
    EvalSpec,
    batch_status,
    cancel,
    check_submission,
    list_batches,
    resume,
    set_budget,
    submit,
)
from herd.llm.eval import results as export
from herd.llm.eval.builtin import tasks as eval_tasks
from herd.llm.eval.money import dollars
from herd.llm.eval.pipeline import Pipeline
from herd.llm.eval.pipeline import load as load_pipeline
from herd.llm.eval.pipeplan import PipelinePlan, plan_pipeline_paths
from herd.llm.eval.pipeplan import render as render_pipeline_plan
from herd.llm.eval.pipesubmit import check_pipeline, submit_pipeline
from herd.llm.eval.plan import Plan, plan_paths
from herd.llm.eval.plan import render as render_plan
from herd.llm.eval.spec import QUEUE, check_budget
from herd.llm.eval.stageview import stage_rows
from herd.llm.eval.status import BatchStatus
from herd.llm.eval.submit import SubmitReport
from herd.llm.follow import print_status
from herd.llm.providers import registry
from herd.worker import Worker

eval_cli = typer.Typer(no_args_is_help=True, help="LLM evaluations of documents.")


def _usage(message: str, hint: str | None = None) -> typer.Exit:
    """A usage error as one line on stderr (typer's box adds nothing to it), exit 2:
    the caller raises what this returns."""
    where = f"Invalid value for {hint}: " if hint else ""
    console.err.print(f"herd: error: {where}{message}", soft_wrap=True)
    return typer.Exit(follow.USAGE)


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _usage(f"{path}: {exc}", what) from None


def _params(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise _usage(f"not JSON: {exc}", "--params") from None
    if not isinstance(value, dict):
        raise _usage("must be a JSON object", "--params")
    return value


# (documents read, documents in all): a submission's reading, shown on stderr
Progress = Callable[[int, int], None]


def _run(ctx: typer.Context, work: Any) -> Any:
    """console.run, with a refusal of the input (InvalidInput) as a usage error: one
    line, exit 2, nothing enqueued."""
    opts = console.opts(ctx)

    async def guarded(app: App) -> Any:
        try:
            return await work(app)
        except InvalidInput as exc:
            return exc

    found = console.run(opts, guarded)
    if isinstance(found, InvalidInput):
        console.err.print(f"herd: error: {found}", soft_wrap=True)
        raise typer.Exit(follow.USAGE)
    return found


@eval_cli.command("submit", epilog=follow.EXIT_CODES)
def eval_submit(
    ctx: typer.Context,
    paths: Annotated[
        list[Path], typer.Argument(metavar="PATH", help="Documents or folders (.txt .md .pdf).")
    ],
    prompt: Annotated[
        Path | None, typer.Option(metavar="FILE", help="File with the system prompt.")
    ] = None,
    model: Annotated[
        str | None, typer.Option(metavar="NAME", help="Model name as the provider knows it.")
    ] = None,
    pipeline: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE", help="A pipeline TOML (split, map, reduce, chain) instead of --prompt."
        ),
    ] = None,
    schema: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="JSON Schema file for the answer; without one, the "
            "answer is the model's text (or its JSON, when it is JSON).",
        ),
    ] = None,
    provider: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help=f"One of {', '.join(registry.names())} (openai: any compatible server).",
        ),
    ] = "openai",  # fmt: skip
    params: Annotated[
        str, typer.Option(metavar="JSON", help='Request parameters, e.g. {"temperature":0}.')
    ] = "{}",
    priority: Annotated[int, typer.Option(metavar="N", help="Higher runs first.")] = 0,
    batch: Annotated[
        str | None, typer.Option(metavar="NAME", help="Batch name; default: generated.")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Run workers here and follow this batch to its end.")
    ] = False,
    concurrency: Annotated[
        int, typer.Option(min=1, metavar="N", help="Workers' concurrency with --wait.")
    ] = 8,
    budget: Annotated[
        float | None,
        typer.Option(
            metavar="USD", help="What the batch's calls may cost; past it, its jobs are parked."
        ),
    ] = None,
    rpm: Annotated[
        int | None, typer.Option(min=1, metavar="N", help="Requests per minute, fleet-wide.")
    ] = None,
    tpm: Annotated[
        int | None, typer.Option(min=1, metavar="N", help="Tokens per minute, fleet-wide.")
    ] = None,
    max_concurrent: Annotated[
        int | None, typer.Option(min=1, metavar="N", help="Calls in flight at once, fleet-wide.")
    ] = None,
    weight: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=1000,
            metavar="N",
            help="Share of the provider's limits beside other batches on them (default 1).",
        ),
    ] = None,
    batch_api: Annotated[
        bool,
        typer.Option(
            "--batch-api",
            help="Through the provider's Batch API: half the price, answers within 24 h.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the outcome as JSON.")] = False,
    fallback: Annotated[
        list[str] | None,
        typer.Option(
            "--fallback",
            metavar="PROVIDER:MODEL",
            help="provider:model to move to while the model is unavailable; repeat for"
            " an ordered list.",
        ),
    ] = None,
    plan: Annotated[
        bool,
        typer.Option(
            "--plan",
            help="Enqueue nothing: print the documents, tokens, dollars (synchronous and"
            " Batch API), provider-cache share and time at the limits; per stage with"
            " --pipeline.",
        ),
    ] = False,
) -> None:
    """Enqueue one evaluation per document.

    Identical documents are evaluated once.
    """
    given = {"rpm": rpm, "tpm": tpm, "max_concurrent": max_concurrent, "weight": weight}
    limits = {k: v for k, v in given.items() if v is not None} or None
    if pipeline is not None:
        if prompt is not None or model is not None or schema is not None:
            raise _usage("give --pipeline, or --prompt and --model, not both", "--pipeline")
        _submit_pipeline(ctx, paths, pipeline, batch=batch, priority=priority, wait=wait,
                         concurrency=concurrency, budget=budget, limits=limits,
                         as_json=as_json, plan=plan, fallbacks=fallback or [],
                         batch_api=batch_api)  # fmt: skip
        return
    if prompt is None or model is None:
        raise _usage("give --prompt and --model (or --pipeline FILE)", "--prompt")
    fallbacks = fallback or []
    try:
        system = prompt.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _usage(f"{prompt}: {exc}", "--prompt") from None
    opts = console.opts(ctx)
    try:
        spec = EvalSpec(
            model=model,
            system=system,
            schema=_read_json(schema, "--schema") if schema else None,
            provider=provider,
            params=_params(params),
        )
        # Checked here too, so a mistake is a usage error before the store is opened.
        check_submission(spec, opts.settings, budget=budget, limits=limits,
                         batch_api=batch_api, batch=batch, fallbacks=fallbacks)  # fmt: skip
        missing = [p for p in paths if not p.exists()]
        if missing:
            raise InvalidInput(f"{missing[0]}: no such file or directory", field="paths")
    except InvalidInput as exc:
        hint = {"schema": "--schema", "params": "--params", "budget": "--budget",
                "provider": "--provider", "batch_api": "--batch-api", "fallbacks": "--fallback",
                "paths": "PATHS"}.get((exc.field or "").split(".")[0])  # fmt: skip
        raise _usage(str(exc), hint) from None
    if plan:
        _print_plan(ctx, paths, spec, limits=limits, batch_api=batch_api, budget=budget,
                    batch=batch, fallbacks=fallbacks, as_json=as_json)  # fmt: skip
        return

    def enqueue(app: App, read: Progress) -> Awaitable[SubmitReport]:
        return submit(app, paths, spec, batch=batch, priority=priority, progress=read,
                      budget=budget, limits=limits, batch_api=batch_api,
                      fallbacks=fallbacks)  # fmt: skip

    def queued(report: SubmitReport) -> str:
        return f"{report.queued} queued, {report.deduplicated} already queued or answered"

    _submit_and_report(ctx, enqueue, queued, wait=wait, concurrency=concurrency, as_json=as_json)


def _submit_and_report(
    ctx: typer.Context,
    enqueue: Callable[[App, Progress], Awaitable[SubmitReport]],
    queued: Callable[[SubmitReport], str],
    *,
    wait: bool,
    concurrency: int,
    as_json: bool,
) -> NoReturn:
    """Every submission's way on, once checked: enqueue (reading progress on stderr),
    say what was queued and what was skipped, follow the batch with --wait, print it."""
    opts = console.opts(ctx)

    async def work(app: App) -> tuple[SubmitReport, int, BatchStatus | None]:
        app.include(eval_tasks)  # the worker's tasks, for --wait

        def read(n: int, total: int) -> None:
            if not as_json:
                console.err.print(f"submitting: {n}/{total} documents read", soft_wrap=True)

        report = await enqueue(app, read)
        console.err.print(
            f"batch {report.batch}: {queued(report)}, {len(report.errors)} unreadable",
            soft_wrap=True,
        )
        for error in report.errors:
            console.err.print(f"  skipped: {error}", soft_wrap=True)
        if not wait:
            return report, 1 if report.errors else 0, None
        code, status = await _follow(app, report.batch, concurrency, opts.debug)
        if report.errors and code == follow.ALL_ANSWERED:
            code = follow.SOME_DEAD
        return report, code, status

    report, code, status = _run(ctx, work)
    if as_json:
        console.print_json({"batch": report.batch, "queued": report.queued,
                            "deduplicated": report.deduplicated, "errors": report.errors,
                            "status": status.to_json() if status else None})  # fmt: skip
    else:
        console.out.print(f"batch {report.batch}")
        if status:
            print_status(status)
    raise typer.Exit(code)


async def _follow(app: App, batch: str, concurrency: int, debug: bool) -> tuple[int, BatchStatus]:
    """Run workers here and follow ``batch`` to its end (submit --wait)."""
    if not debug:  # the display says what the worker's INFO lines would
        logging.getLogger("herd.worker").setLevel(logging.WARNING)
    worker = Worker(app, queues=[QUEUE], concurrency=concurrency, poll_interval=0.2,
                    install_signal_handlers=False, grace_period=10.0)  # fmt: skip
    return await follow.follow(
        app, batch, console.err, run_workers=worker.run, stop_workers=worker.stop
    )


def _submit_pipeline(
    ctx: typer.Context, paths: list[Path], path: Path, *, batch: str | None, priority: int,
    wait: bool, concurrency: int, budget: float | None, limits: dict[str, int] | None,
    as_json: bool, plan: bool = False, fallbacks: list[str] | None = None,
    batch_api: bool = False,
) -> None:  # fmt: skip
    """`herd eval submit DOCS --pipeline FILE`: every stage checked before anything is
    stored (one line, exit 2), the documents split and their first stage enqueued.
    ``--batch-api``: every model stage through the Batch API."""
    opts = console.opts(ctx)
    try:
        pipe = load_pipeline(path)
        if batch_api:
            pipe = pipe.through_batch_api()
        check_pipeline(pipe, opts.settings, budget=budget, limits=limits, batch=batch,
                       fallbacks=fallbacks or [])  # fmt: skip
        missing = [p for p in paths if not p.exists()]
        if missing:
            raise InvalidInput(f"{missing[0]}: no such file or directory", field="paths")
    except InvalidInput as exc:
        hint = {
            "paths": "PATHS",
            "fallbacks": "--fallback",
            "budget": "--budget",
            "batch_api": "--batch-api" if batch_api else "--pipeline",
        }
        raise _usage(str(exc), hint.get(exc.field or "", "--pipeline")) from None
    if plan:
        _print_pipeline_plan(ctx, paths, pipe, limits=limits, budget=budget, batch=batch,
                             fallbacks=fallbacks or [], as_json=as_json)  # fmt: skip
        return

    def enqueue(app: App, read: Progress) -> Awaitable[SubmitReport]:
        return submit_pipeline(app, paths, pipe, batch=batch, priority=priority, progress=read,
                               budget=budget, limits=limits,
                               fallbacks=fallbacks or [])  # fmt: skip

    def queued(report: SubmitReport) -> str:
        return f"{report.queued} pieces queued for stage {pipe.first.name!r}"

    _submit_and_report(ctx, enqueue, queued, wait=wait, concurrency=concurrency, as_json=as_json)


def _print_plan(ctx: typer.Context, paths: list[Path], spec: EvalSpec, *,
                limits: dict[str, Any] | None, batch_api: bool, budget: float | None,
                batch: str | None, fallbacks: list[str], as_json: bool) -> None:  # fmt: skip
    """``submit --plan``: what the submission would cost and take; nothing enqueued."""

    async def work(app: App) -> Plan:
        return await plan_paths(app, paths, spec, limits=limits, batch_api=batch_api,
                                budget=budget, batch=batch, fallbacks=fallbacks)  # fmt: skip

    found: Plan = _run(ctx, work)
    if as_json:
        console.print_json(found.to_json())
        return
    for line in render_plan(found):
        console.out.print(line, soft_wrap=True, highlight=False, markup=False)
    for error in found.unreadable:
        console.err.print(f"  unreadable: {error}", soft_wrap=True)


def _print_pipeline_plan(
    ctx: typer.Context, paths: list[Path], pipe: Pipeline, *, limits: dict[str, Any] | None,
    budget: float | None, batch: str | None, fallbacks: list[str], as_json: bool,
) -> None:  # fmt: skip
    """``submit --pipeline --plan``: each stage's calls, tokens and dollars; nothing
    enqueued."""

    async def work(app: App) -> PipelinePlan:
        return await plan_pipeline_paths(app, paths, pipe, limits=limits, budget=budget,
                                         batch=batch, fallbacks=fallbacks)  # fmt: skip

    found: PipelinePlan = _run(ctx, work)
    if as_json:
        console.print_json(found.to_json())
        return
    for line in render_pipeline_plan(found):
        console.out.print(line, soft_wrap=True, highlight=False, markup=False)
    for error in found.unreadable:
        console.err.print(f"  unreadable: {error}", soft_wrap=True)


@eval_cli.command("wait", epilog=follow.EXIT_CODES)
def eval_wait(
    ctx: typer.Context,
    batch: Annotated[str, typer.Argument(metavar="BATCH", help="The batch to follow.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the end status as JSON.")] = False,
) -> None:
    """Follow a batch until it is answered, dead or parked.

    Workers elsewhere (`herd worker`) run it.
    """

    async def work(app: App) -> tuple[int, BatchStatus]:
        return await follow.follow(app, batch, console.err)

    code, status = console.run(console.opts(ctx), work)
    if as_json:
        console.print_json(status.to_json())
    else:
        print_status(status)
    raise typer.Exit(code)


@eval_cli.command("list")
def eval_list(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=1000, metavar="N", help="Batches to show.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines, one per batch.")] = False,
) -> None:
    """The batches, newest first.

    Documents answered, spend, and whether parked.
    """
    found = console.run(console.opts(ctx), lambda app: list_batches(app, limit=limit))
    if as_json:
        for b in found:
            console.print_json(b)
        return
    if not found:
        console.err.print("no batches yet: `herd eval submit` makes one")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("batch", "created", "answered", "spent", "state"):
        # Names and states fold when they must; times and figures stay on one line.
        table.add_column(col, justify="right" if col in ("answered", "spent") else "left",
                         overflow="fold", no_wrap=col not in ("batch", "state"))  # fmt: skip
    for b in found:
        state = f"parked ({b['parked']})" if b["state"] == "parked" else b["state"]
        if b["failed"]:
            state += f", {b['failed']} failed"
        # An unpriced model's calls are in no sum: never shown as $0.00.
        spent = ("unpriced" if b["unpriced"] and not b["spent"] else dollars(b["spent"])
                 + (" + unpriced" if b["unpriced"] else ""))  # fmt: skip
        spent += f" / {dollars(b['budget'])}" if b["budget"] is not None else ""
        table.add_row(b["batch"], b["created_at"][5:16].replace("T", " "),
                      f"{b['done']}/{b['documents']}", spent, state)  # fmt: skip
    console.out.print(table)


@eval_cli.command("status")
def eval_status(
    ctx: typer.Context,
    batch: Annotated[
        str | None, typer.Argument(metavar="BATCH", help="One batch; default: all.")
    ] = None,
    batch_opt: Annotated[
        str | None, typer.Option("--batch", metavar="NAME", help="The same, as an option.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print it as JSON.")] = False,
) -> None:
    """Progress, failures, spend and the cost ledger.

    The ledger counts the calls made and those avoided.
    """
    name = batch or batch_opt
    status = console.run(console.opts(ctx), lambda app: batch_status(app, name))
    if as_json:
        console.print_json(status.to_json())
    else:
        print_status(status)


@eval_cli.command("show")
def eval_show(
    ctx: typer.Context,
    batch: Annotated[str, typer.Argument(metavar="BATCH", help="The batch.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print it as JSON.")] = False,
) -> None:
    """One batch, with its failed documents.

    Progress, why it waits and what to run, failed documents by path.
    """
    status = console.run(console.opts(ctx), lambda app: batch_status(app, batch))
    if as_json:
        console.print_json(status.to_json())
        return
    print_status(status)
    if status.failures:
        table = Table(title="failed documents", title_justify="left", box=None)
        table.add_column("path", overflow="fold")
        table.add_column("error", overflow="fold")
        for f in status.failures:
            table.add_row(f["path"], console.short(f["error"], 200))
        console.out.print(table)


@eval_cli.command("budget")
def eval_budget(
    ctx: typer.Context,
    batch: Annotated[str, typer.Argument(metavar="BATCH", help="The batch.")],
    usd: Annotated[float, typer.Argument(metavar="USD", help="The new budget in USD.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print it as JSON.")] = False,
) -> None:
    """Raise or lower a batch's budget.

    A batch parked for its budget resumes once it has room again.
    """
    try:
        check_budget(usd, "USD")
    except InvalidInput as exc:
        raise _usage(str(exc), "USD") from None
    found = _run(ctx, lambda app: set_budget(app, batch, usd))
    if as_json:
        console.print_json({"batch": batch, **found})
        return
    console.out.print(
        f"batch {batch}: budget {dollars(usd)}, spent {dollars(found['spent'])},"
        f" {found['resumed']} jobs resumed"
        + (f", still parked ({found['parked']})" if found["parked"] else ""),
        soft_wrap=True,
    )


@eval_cli.command("resume")
def eval_resume(
    ctx: typer.Context,
    batch: Annotated[str, typer.Argument(metavar="BATCH", help="The batch.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print it as JSON.")] = False,
) -> None:
    """Continue a parked batch.

    One parked because the provider refused its key or model (once fixed), or for its
    budget.
    """
    found = _run(ctx, lambda app: resume(app, batch))
    if as_json:
        console.print_json(found)
        return
    console.out.print(f"batch {batch}: {found['resumed']} jobs resumed", soft_wrap=True)


@eval_cli.command("cancel")
def eval_cancel(
    ctx: typer.Context,
    batch: Annotated[str, typer.Argument(metavar="BATCH", help="The batch.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print it as JSON.")] = False,
) -> None:
    """Stop a batch; answers already paid for are kept.

    No more calls are made for it and its provider batches are cancelled.
    """
    found = console.run(console.opts(ctx), lambda app: cancel(app, batch))
    if as_json:
        console.print_json(found)
        return
    console.out.print(
        f"batch {batch}: {found['cancelled_items']} items cancelled,"
        f" {len(found['provider_batches'])} provider batches asked to stop",
        soft_wrap=True,
    )
    for f in found["provider_cancel_failed"]:
        console.err.print(
            f"provider batch {f['provider_batch']}: cancel failed ({f['error']});"
            " its poll job asks again",
            soft_wrap=True,
        )


def _stage_results(ctx: typer.Context, batch: str, stage: str, output: Path | None) -> None:
    """`herd eval results BATCH --stage NAME`: one JSON line per piece of the stage."""

    async def work(app: App) -> int:
        sink = output.open("w", encoding="utf-8") if output else sys.stdout
        n = 0
        try:
            async for row in stage_rows(app, batch, stage):
                export.write_jsonl(sink, row)
                n += 1
        finally:
            if sink is not sys.stdout:
                sink.close()
        return n

    n = _run(ctx, work)
    if output is not None:
        console.err.print(f"wrote {n} rows to {output}")


@eval_cli.command("results")
def eval_results(
    ctx: typer.Context,
    batch: Annotated[str | None, typer.Argument(metavar="BATCH", help="The batch.")] = None,
    batch_opt: Annotated[
        str | None, typer.Option("--batch", metavar="NAME", help="The same, as an option.")
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", metavar="FORMAT", help="jsonl, csv or parquet.")
    ] = "jsonl",
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", metavar="FILE", help="Write to this file (needed for parquet)."
        ),
    ] = None,
    stage: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="A pipeline's stage: its answers per piece, with page, section"
            " and characters (jsonl).",
        ),
    ] = None,
) -> None:
    """One row per document, dead ones included with their error.

    Path, status, model, source, tokens, cost, seconds, and the answer (a column per
    schema field in csv).
    """
    name = batch or batch_opt
    if name is None:
        raise _usage("name the batch (`herd eval list` shows them)", "BATCH")
    if fmt not in ("jsonl", "csv", "parquet"):
        raise _usage("use jsonl, csv or parquet", "--format")
    if fmt == "parquet" and output is None:
        raise _usage("parquet is written to a file: give --output FILE", "--output")
    if stage is not None:
        if fmt != "jsonl":
            raise _usage("a stage's answers are written as jsonl", "--format")
        _stage_results(ctx, name, stage, output)
        return

    async def work(app: App) -> int:
        rt = await EvalRuntime.of(app)
        found = await rt.store.execute("batch_schema", {"b": name})
        fields = export.fields_of(found[0][0] if found else None)
        sink = output.open("w", encoding="utf-8", newline="") if output and fmt != "parquet" \
            else sys.stdout  # fmt: skip
        table: list[dict[str, Any]] = []
        writer = export.write_csv_header(sink, fields) if fmt == "csv" else None
        n = 0
        async for row in export.rows(app, name):
            n += 1
            if fmt == "jsonl":
                export.write_jsonl(sink, row)
            elif writer is not None:
                writer.writerow(export.csv_row(row, fields))
            else:
                table.append(row)
        if fmt == "parquet":
            assert output is not None
            export.write_parquet(str(output), table, fields)
        if sink is not sys.stdout:
            sink.close()
        return n

    try:
        n = console.run(console.opts(ctx), work)
    except ImportError:
        console.err.print(
            "herd: error: --format parquet needs pyarrow: pip install 'herd[parquet]'"
        )
        raise typer.Exit(follow.USAGE) from None
    if output is not None:
        console.err.print(f"wrote {n} rows to {output}")
