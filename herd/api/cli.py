"""`herd serve` (API, dashboard, metrics) and `herd status` (the dashboard in a terminal)."""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from herd import console
from herd.api.models import OverviewOut
from herd.api.overview import LEDGER_KINDS, OTHERS, depth, overview
from herd.api.security import check_bind, weakest
from herd.durations import duration
from herd.errors import ConfigError
from herd.llm.eval.ledger import PAID

_LEDGER_LABELS = {
    "call": "provider calls",
    "lost": "lost (lease lost mid-call)",
    "failed": "failed after sending",
    "cut_short": "cut short (worker died)",
    "cache": "avoided: cache",
    "singleflight": "avoided: singleflight",
    "dedup": "avoided: dedup",
}
_SPARK = " ▁▂▃▄▅▆▇█"


def _of(now: float, limit: int | None) -> str:
    """Use now against its limit: "412 / 600", or the use alone where none is set."""
    return f"{now:,.0f} / {limit:,}" if limit is not None else f"{now:,.0f}"


def serve(
    ctx: typer.Context,
    host: Annotated[
        str,
        typer.Option(
            metavar="ADDRESS", help="Address to bind; beyond loopback needs HERD_API_TOKEN."
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, metavar="PORT", help="Port to listen on.")
    ] = 8000,
    body_limit: Annotated[
        int | None,
        typer.Option(
            min=1,
            metavar="BYTES",
            help="Largest request body (env HERD_API_BODY_LIMIT); default 1 MiB.",
        ),
    ] = None,
) -> None:
    """Serve the HTTP API, the dashboard and Prometheus metrics.

    The dashboard is at /, the metrics at /metrics.
    """
    import uvicorn

    from herd.api.app import create_app

    o = console.opts(ctx)
    try:
        check_bind(host, weakest(o.settings.bearer_tokens()))
    except ConfigError as exc:
        console.err.print(f"herd: error: {exc}", soft_wrap=True)
        raise typer.Exit(2) from None
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again to die by
    # it, which skips atexit: the embedded PostgreSQL this process holds would be left
    # running. The handler it restores before raising is this one: a normal exit.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # Reach the stores once before serving: a wrong URL is one line here, not a
    # traceback from the server's startup.
    console.run(o, lambda app: app.stats())
    access = "bearer token required" if o.settings.bearer_tokens() else "no token: loopback only"
    shown = f"[{host}]" if ":" in host else host
    console.err.print(f"herd: serving on http://{shown}:{port}/ ({access})", soft_wrap=True)
    config = uvicorn.Config(
        create_app(o.settings, body_limit=body_limit),
        host=host,
        port=port,
        log_level="debug" if o.debug else "info",
        lifespan="on",
        server_header=False,
    )
    console.mask_logs()  # uvicorn's handlers exist once its config is made
    uvicorn.Server(config).run()


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def status(
    ctx: typer.Context,
    minutes: Annotated[
        int, typer.Option(min=1, max=120, metavar="N", help="Throughput window in minutes.")
    ] = 30,
    limit: Annotated[int, typer.Option(min=1, max=500, metavar="N", help="Rows per table.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print it as JSON.")] = False,
) -> None:
    """The dashboard in a terminal: queues, jobs, caches, spend.

    Queues, running jobs, throughput, dead letters, caches and the cost ledger.
    """
    ov = console.run(console.opts(ctx), lambda app: overview(app, minutes=minutes, limit=limit))
    if as_json:
        sys.stdout.write(ov.model_dump_json() + "\n")
        return
    print_overview(ov)


def _money(value: float | None) -> str:
    return f"${value:,.4f}" if value else ""


def _ledger_money(calls: int, value: float | None, unpriced: int = 0) -> str:
    """A ledger row's cost (or saving): calls without a figure are of models without a
    price, whose cost is unknown, never $0; some of them (``unpriced``) beside priced
    ones make the figure a part."""
    if calls and value is None:
        return "unpriced"
    return _money(value) + (" + unpriced" if unpriced else "")


def sparkline(counts: list[int]) -> str:
    top = max(counts, default=0)
    return (
        "".join(_SPARK[0 if not n else max(1, round(n / top * 8))] for n in counts) if top else ""
    )


def _table(title: str, *columns: str) -> Table:
    # No box: its lines and padding cost a third of an 80-column terminal.
    table = Table(title=title, title_justify="left", title_style="bold", box=None,
                  pad_edge=False, header_style="bold")  # fmt: skip
    for col in columns:
        right = col.startswith(">")
        # Identifiers and numbers stay on one line; free text (errors) wraps.
        table.add_column(
            col.lstrip(">"),
            justify="right" if right else "left",
            no_wrap=col not in ("last error", ""),
            overflow="ellipsis",
        )
    return table


def print_overview(ov: OverviewOut) -> None:
    out = console.out
    tp = ov.throughput
    done, dead = sum(tp.succeeded), sum(tp.dead)
    out.print(
        Text.assemble(
            ("herd", "bold"),
            f"  broker {ov.broker}  ·  {ov.now:%Y-%m-%d %H:%M:%S} UTC\nlast {tp.minutes} min: ",
            (f"{done} succeeded", "green"),
            ", ",
            (f"{dead} dead-lettered", "red" if dead else ""),
            "  ",
            (sparkline([s + d for s, d in zip(tp.succeeded, tp.dead, strict=True)]), "cyan"),
        )
    )
    for problem in ov.problems:
        console.err.print(f"herd: warning: {problem}", soft_wrap=True)

    q = _table(
        "queues",
        "queue",
        ">pending",
        ">ready",
        ">running",
        ">succeeded",
        ">dead",
        ">oldest wait",
        ">depth",
    )
    for s in ov.queues:
        n = {k.value: v for k, v in s.counts.items()}
        q.add_row(
            f"{ov.queues_hidden:,} other queues" if s.queue == OTHERS else s.queue,
            f"{n.get('pending', 0):,}",
            f"{s.ready:,}",
            *[f"{n.get(k, 0):,}" for k in ("processing", "succeeded", "dead")],
            "" if s.oldest_ready_age is None else duration(s.oldest_ready_age, compact=True),
            f"{depth(s):,}",
        )
    out.print(q)

    r = _table("running", ">id", "task", "queue", "worker", ">try", ">lease left")
    for run in ov.running:
        late = run.lease_left < 0
        left = Text(duration(run.lease_left, compact=True), style="red" if late else "")
        r.add_row(str(run.id), run.task, run.queue, run.owner or "", str(run.attempts + 1), left)
    out.print(r if ov.running else Text("running: none", style="dim"))

    if ov.dead:  # each error on lines of its own: in a column it reads a word a line
        dead_rows = [
            ([str(job.id), job.task, job.queue, job.dead_reason or "",
              console.moment(job.finished_at)], console.short(job.last_error or "", 200))
            for job in ov.dead
        ]  # fmt: skip
        console.listing("dead-letter queue", ["id", "task", "queue", "reason", "finished"],
                        dead_rows, right=("id",))  # fmt: skip
    else:
        out.print(Text("dead-letter queue: empty", style="dim"))

    c = _table("caches", "cache", "namespace", ">hit rate", ">hits", ">misses", ">entries")
    for cache in ov.caches:
        rate = f"{cache.hit_rate:.1%}" if cache.hit_rate is not None else ""
        c.add_row(
            cache.cache,
            cache.namespace,
            rate,
            f"{cache.hits:,}",
            f"{cache.misses:,}",
            f"{cache.entries:,}",
        )
    out.print(c if ov.caches else Text("caches: no lookups yet", style="dim"))

    led = _table(
        "cost ledger", "", ">calls", ">tokens in", ">tokens out", ">spent", ">saved (est.)"
    )
    rows = {row.kind: row for row in ov.ledger}
    for kind in LEDGER_KINDS:
        row = rows.get(kind)
        if row is not None:
            led.add_row(
                _LEDGER_LABELS[kind],
                f"{row.calls:,}",
                f"{row.input_tokens:,}",
                f"{row.output_tokens:,}",
                _ledger_money(row.calls, row.cost, row.unpriced) if kind in PAID else "",
                "" if kind in PAID else _ledger_money(row.calls, row.saved),
            )
    out.print(led)

    if ov.limits:
        lim = _table(
            "provider limits", "scope", ">requests", ">tokens", ">in flight", ">waits",
            ">429s", ">paused",
        )  # fmt: skip
        for lr in ov.limits:
            lim.add_row(
                lr.scope,
                _of(lr.requests_now, lr.rpm),
                _of(lr.tokens_now, lr.tpm),
                _of(lr.in_flight, lr.max_concurrent),
                f"{lr.waits:,}",
                f"{lr.rate_limited:,}",
                f"{lr.paused_for:.1f} s" if lr.paused_for else "",
            )
        out.print(lim)
