"""`herd eval …` and `herd cache …`: submit evaluations, watch their progress and cost."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from herd import console
from herd.app import App
from herd.errors import InvalidInput
from herd.llm import batchapi
from herd.llm.cancel import cancel
from herd.llm.evaluate import (
    QUEUE,
    EvalRuntime,
    EvalSpec,
    batch_status,
    check_budget,
    set_budget,
    settle,
    submit,
)

eval_cli = typer.Typer(no_args_is_help=True, help="LLM evaluations of documents.")
cache_cli = typer.Typer(
    no_args_is_help=True, help="The exact result cache and the semantic query cache."
)


def _read_json_file(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint=what) from None


@eval_cli.command("submit")
def eval_submit(
    ctx: typer.Context,
    paths: Annotated[list[Path], typer.Argument(help="Documents or folders (.txt .md .pdf).")],
    prompt: Annotated[Path, typer.Option(help="File with the system prompt.")],
    model: Annotated[str, typer.Option(help="Model name as the provider knows it.")],
    schema: Annotated[Path | None, typer.Option(help="JSON Schema file for the answer.")] = None,
    provider: Annotated[
        str, typer.Option(help="openai (any compatible server) or anthropic")
    ] = "openai",
    params: Annotated[
        str, typer.Option(help='Request parameters as JSON, e.g. {"temperature":0}')
    ] = "{}",
    priority: Annotated[int, typer.Option()] = 0,
    batch: Annotated[str | None, typer.Option(help="Batch name [default: generated].")] = None,
    wait: Annotated[bool, typer.Option(help="Run workers here until the batch is done.")] = False,
    concurrency: Annotated[int, typer.Option(min=1, help="Workers' concurrency with --wait.")] = 8,
    budget: Annotated[
        float | None,
        typer.Option(help="USD the batch's calls may cost; past it, its jobs are parked."),
    ] = None,
    rpm: Annotated[int | None, typer.Option(min=1, help="Requests per minute, fleet-wide.")] = None,
    tpm: Annotated[int | None, typer.Option(min=1, help="Tokens per minute, fleet-wide.")] = None,
    max_concurrent: Annotated[
        int | None, typer.Option(min=1, help="Calls in flight at once, fleet-wide.")
    ] = None,
    batch_api: Annotated[
        bool,
        typer.Option(
            "--batch-api",
            help="Through the provider's Batch API: half the price, answers within 24 h.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Enqueue one evaluation per document (identical ones are evaluated once)."""
    try:
        check_budget(budget, "--budget")
    except InvalidInput as exc:
        raise typer.BadParameter(str(exc), param_hint="--budget") from None
    given = {"rpm": rpm, "tpm": tpm, "max_concurrent": max_concurrent}
    limits = {k: v for k, v in given.items() if v is not None} or None
    if provider not in ("openai", "anthropic"):
        raise typer.BadParameter("use openai or anthropic", param_hint="--provider")
    try:
        system = prompt.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(f"{prompt}: {exc}", param_hint="--prompt") from None
    opts = console.opts(ctx)
    try:
        spec = EvalSpec(
            model=model,
            system=system,
            schema=_read_json_file(schema, "--schema") if schema else None,
            provider=provider,
            params=_read_json_file_text(params),
        )
        spec.check(opts.settings)
    except InvalidInput as exc:
        raise typer.BadParameter(str(exc), param_hint="--params") from None
    if batch_api:
        try:
            batchapi.check_provider(spec)
            batchapi.check_unlimited(budget, limits)
        except InvalidInput as exc:
            raise typer.BadParameter(str(exc), param_hint="--batch-api") from None

    async def work(app: App) -> Any:
        from herd.builtin import tasks as builtin_tasks
        from herd.worker import Worker

        app.include(builtin_tasks)
        with Progress(
            TextColumn("submitting"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console.err,
            transient=True,
        ) as bar:
            task = bar.add_task("submit", total=None)
            report = await submit(
                app,
                paths,
                spec,
                batch=batch,
                priority=priority,
                progress=lambda n: bar.update(task, completed=n),
                budget=budget,
                limits=limits,
                batch_api=batch_api,
            )
        console.err.print(
            f"batch {report.batch}: {report.queued} queued, {report.deduplicated} already queued,"
            f" {len(report.errors)} unreadable",
            soft_wrap=True,
            highlight=False,
        )
        for error in report.errors:
            console.err.print(f"  skipped: {error}", soft_wrap=True, highlight=False, markup=False)
        if wait and report.job_ids:
            await Worker(
                app, queues=[QUEUE], concurrency=concurrency, stop_when_idle=True, poll_interval=0.2
            ).run()
        return report, (await batch_status(app, report.batch) if wait else None)

    report, status = console.run(opts, work)
    if as_json:
        console.print_json(
            {
                "batch": report.batch,
                "queued": report.queued,
                "deduplicated": report.deduplicated,
                "errors": report.errors,
                "status": status,
            }
        )
    else:
        console.out.print(f"batch {report.batch}")
        if status:
            _print_status(status)
    if report.errors or (status and status["failed"]):
        raise typer.Exit(1)


def _read_json_file_text(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--params") from None
    if not isinstance(value, dict):
        raise typer.BadParameter("must be a JSON object", param_hint="--params")
    return value


def _print_status(status: dict[str, Any]) -> None:
    led = status["ledger"]

    def n(kind: str, field: str = "n") -> Any:
        return led.get(kind, {}).get(field) or 0

    console.out.print(
        f"{status['done']}/{status['documents']} done, {status['running']} running,"
        f" {status['failed']} failed (dead-lettered), {status.get('parked_items', 0)} parked"
        + (f", {status['cancelled_items']} cancelled" if status.get("cancelled_items") else ""),
        highlight=False,
    )
    if status.get("spent") is not None:
        budget = status["budget"]
        console.out.print(
            f"budget {'none' if budget is None else f'${budget:.4f}'},"
            f" spent ${status['spent']:.4f}, reserved ${status['reserved']:.4f}"
            + (f", parked ({status['parked']})" if status["parked"] else ""),
            highlight=False,
        )
    if status.get("limits"):
        console.out.print(
            "limits " + ", ".join(f"{k} {v}" for k, v in sorted(status["limits"].items())),
            highlight=False,
        )
    if status.get("limit_usage"):
        use = Table(title="provider limits (fleet-wide)", title_justify="left")
        for col in ("scope", "requests", "tokens", "in flight", "waits", "waited", "429s"):
            use.add_column(col, justify="left" if col == "scope" else "right")
        for u in status["limit_usage"]:
            lim = u["limit"]

            def of(now: float, name: str, lim: dict[str, Any] = lim) -> str:
                return f"{now:,.0f} / {lim[name]:,}" if lim.get(name) else f"{now:,.0f}"

            paused = f" (paused {u['paused_for']:.1f} s)" if u["paused_for"] else ""
            use.add_row(
                u["scope"] + paused,
                of(u["requests_now"], "rpm"),
                of(u["tokens_now"], "tpm"),
                of(u["in_flight"], "max_concurrent"),
                f"{u['waits']:,}",
                f"{u['wait_seconds']:.1f} s",
                f"{u['rate_limited']:,}",
            )
        console.out.print(use)
    table = Table(title="cost ledger", title_justify="left")
    for col in ("", "calls", "tokens in", "tokens out", "cost"):
        table.add_column(col, justify="right" if col else "left")
    for kind, label in (
        ("call", "provider calls"),
        ("lost", "lost (lease lost mid-call)"),
        ("failed", "failed after sending"),
        ("cut_short", "cut short (worker died)"),
        ("cache", "avoided: cache"),
        ("singleflight", "avoided: singleflight"),
        ("dedup", "avoided: dedup"),
    ):
        cost = led.get(kind, {}).get("cost")
        table.add_row(
            label,
            str(n(kind)),
            f"{n(kind, 'input_tokens'):,}",
            f"{n(kind, 'output_tokens'):,}",
            f"${cost:.4f}" if cost else "",
        )
    console.out.print(table)
    pc = status.get("provider_cache") or {}
    if pc.get("cached_input_tokens") or pc.get("cache_write_tokens"):
        saved = pc.get("saved")
        console.out.print(
            f"provider cache: {pc['cached_input_tokens']:,} input tokens read from it,"
            f" {pc['cache_write_tokens']:,} written"
            + (f", ${saved:.4f} saved" if saved is not None else "")
            + " (apart from herd's cache)",
            highlight=False,
        )


@eval_cli.command("status")
def eval_status(
    ctx: typer.Context,
    batch: Annotated[str | None, typer.Option(help="One batch [default: all].")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Progress, failures and the cost ledger (calls made and avoided)."""
    status = console.run(console.opts(ctx), lambda app: batch_status(app, batch))
    if as_json:
        console.print_json(status)
    else:
        _print_status(status)


@eval_cli.command("budget")
def eval_budget(
    ctx: typer.Context,
    batch: Annotated[str, typer.Argument(help="The batch.")],
    usd: Annotated[float, typer.Argument(help="The new budget in USD.")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Raise or lower a batch's budget; a parked batch with room again resumes."""
    try:
        check_budget(usd, "USD")
    except InvalidInput as exc:
        raise typer.BadParameter(str(exc), param_hint="USD") from None
    found = console.run(console.opts(ctx), lambda app: set_budget(app, batch, usd))
    if as_json:
        console.print_json({"batch": batch, **found})
    else:
        console.out.print(
            f"batch {batch}: budget ${usd:.4f}, spent ${found['spent']:.4f},"
            f" {found['resumed']} jobs resumed"
            + (f", parked ({found['parked']})" if found["parked"] else ""),
            highlight=False,
        )


@eval_cli.command("cancel")
def eval_cancel(
    ctx: typer.Context,
    batch: Annotated[str, typer.Argument(help="The batch.")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Stop a batch: no more calls for it, its provider batches cancelled; answers
    already paid for are kept."""
    found = console.run(console.opts(ctx), lambda app: cancel(app, batch))
    if as_json:
        console.print_json(found)
        return
    console.out.print(
        f"batch {batch}: {found['cancelled_items']} items cancelled,"
        f" {len(found['provider_batches'])} provider batches asked to stop",
        highlight=False,
    )
    for f in found["provider_cancel_failed"]:
        console.err.print(
            f"provider batch {f['provider_batch']}: cancel failed ({f['error']});"
            " its poll job asks again",
            highlight=False,
        )


@eval_cli.command("results")
def eval_results(
    ctx: typer.Context,
    batch: Annotated[str | None, typer.Option(help="One batch [default: all].")] = None,
    fmt: Annotated[str, typer.Option("--format", help="jsonl or csv")] = "jsonl",
) -> None:
    """The evaluations that are done, one per document."""
    if fmt not in ("jsonl", "csv"):
        raise typer.BadParameter("use jsonl or csv", param_hint="--format")

    async def work(app: App) -> list[tuple[Any, ...]]:
        rt = await EvalRuntime.of(app)
        await settle(app, batch)
        return await rt.store.execute(
            "SELECT batch, path, source, result FROM herd_eval_items WHERE status = 'done'"
            " AND (%(b)s::text IS NULL OR batch = %(b)s) ORDER BY batch, path",
            {"b": batch},
        )

    rows = console.run(console.opts(ctx), work)
    if fmt == "jsonl":
        for b, path, source, result in rows:
            sys.stdout.write(
                json.dumps(
                    {"batch": b, "path": path, "source": source, "output": result.get("output")},
                    ensure_ascii=False,
                )
                + "\n"
            )
        return
    writer = csv.writer(sys.stdout)
    writer.writerow(["batch", "path", "source", "output"])
    for b, path, source, result in rows:
        writer.writerow([b, path, source, json.dumps(result.get("output"), ensure_ascii=False)])


@cache_cli.command("stats")
def cache_stats(
    ctx: typer.Context, as_json: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """Entries, hits, misses and computations of the exact and the semantic cache."""

    async def work(app: App) -> dict[str, Any]:
        from herd.semantic.runtime import backend_stats

        return {
            "exact": await (await EvalRuntime.of(app)).cache.store.stats(),
            "semantic": await backend_stats(app),
        }

    stats = console.run(console.opts(ctx), work)
    if as_json:
        console.print_json(stats)
        return
    cols = ("entries", "hits", "misses", "computed", "waited", "stale", "early_refresh", "errors")
    table = Table(title="exact cache", title_justify="left")
    table.add_column("namespace")
    for col in cols:
        table.add_column(col, justify="right")
    for ns, counters in sorted(stats["exact"].items()):
        table.add_row(ns, *[str(counters.get(c, 0)) for c in cols])
    console.out.print(table)
    _print_semantic_stats(stats["semantic"])


def _print_semantic_stats(stats: dict[str, dict[str, Any]]) -> None:
    cols = ("entries", "hits", "misses", "hit_rate", "guard_rejections", "lock_waits",
            "stampedes_suppressed", "stale", "evictions", "p50 lookup")  # fmt: skip
    table = Table(title="semantic cache", title_justify="left")
    table.add_column("cache")
    for col in cols:
        table.add_column(col.replace("_", " "), justify="right")
    for name, figures in stats.items():
        cells = [
            f"{figures['hit_rate']:.1%}" if c == "hit_rate" else str(figures.get(c, 0))
            for c in cols[:-1]
        ]
        table.add_row(name, *cells, _quantile(figures["lookup_seconds"], 0.5))
    console.out.print(table)
    for name, figures in stats.items():
        sims = figures["nearest_similarity"]
        if not sims["count"]:
            continue
        below, shown = 0, []
        for le, n in sims["buckets"].items():
            if n > below:
                shown.append(f"≤{le}: {n - below}")
            below = n
        console.out.print(f"{name}: nearest similarity  " + "  ".join(shown), highlight=False)


def _quantile(hist: dict[str, Any], q: float) -> str:
    """The bucket bound under which a share ``q`` of the observations fall."""
    if not hist["count"]:
        return "-"
    for le, n in hist["buckets"].items():
        if n >= q * hist["count"]:
            return "> 1 s" if le == "+Inf" else f"≤ {float(le) * 1000:g} ms"
    return "-"


@cache_cli.command("clear")
def cache_clear(
    ctx: typer.Context,
    namespace: Annotated[
        str | None, typer.Option(help="One exact-cache namespace [default: all].")
    ] = None,
    collection: Annotated[
        str | None,
        typer.Option(help="Only the semantic cache's answers about this collection."),
    ] = None,
    which: Annotated[str, typer.Option(help="exact, semantic or both")] = "both",
) -> None:
    """Remove cached results (the next request for them computes again)."""
    if which not in ("exact", "semantic", "both"):
        raise typer.BadParameter("use exact, semantic or both", param_hint="--which")
    if collection is not None:
        which = "semantic"  # the exact cache does not know collections

    async def work(app: App) -> tuple[int, int]:
        from herd.semantic.runtime import backend_clear

        exact = semantic = 0
        if which in ("exact", "both"):
            exact = await (await EvalRuntime.of(app)).cache.store.clear(namespace)
        if which in ("semantic", "both"):
            semantic = await backend_clear(app, name=None, collection=collection)
        return exact, semantic

    exact, semantic = console.run(console.opts(ctx), work)
    console.out.print(
        f"removed {exact} exact and {semantic} semantic cache entries", highlight=False
    )
