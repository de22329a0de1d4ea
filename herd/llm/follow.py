"""Following one batch from the terminal: ``herd eval submit --wait`` and ``herd eval
wait``. A live progress display on stderr (plain periodic lines when stderr is not a
terminal), and an end that says how the batch stands and what to run next.

``--wait`` follows its own batch only: it returns when each of its documents is
answered or dead, at once when the batch parks (budget, cancel, a refused key), and on
Ctrl-C with a count of what is still queued (workers elsewhere finish it).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable, Coroutine
from decimal import Decimal
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from herd import console
from herd.app import App
from herd.durations import duration
from herd.llm.eval import BatchStatus, batch_status
from herd.llm.eval.money import dollars, money

# Exit codes of `herd eval submit --wait` and `herd eval wait`, listed in their --help.
ALL_ANSWERED = 0
SOME_DEAD = 1
USAGE = 2
PARKED = 3
INTERRUPTED = 130
EXIT_CODES = (
    "Exit codes: 0 every document answered; 1 some dead-lettered (named on stderr);"
    " 2 usage error (nothing enqueued); 3 the batch is parked or cancelled (the reason and"
    " the command to resume are printed); 130 interrupted (workers elsewhere go on)."
)
PLAIN_EVERY = 10.0  # seconds between progress lines when stderr is not a terminal


def summary(s: BatchStatus) -> str:
    """One line: answered / dead / queued of the total, rate, ETA, spend."""
    parts = [f"{s.done}/{s.documents} answered"]
    for stage in s.stages:  # a batch in stages: the pieces of each stage under way
        ended = stage["done"] + stage["failed"] + stage["cancelled"]
        if ended < stage["pieces"]:
            in_round = f" round {stage['round']}" if stage.get("round", 1) > 1 else ""
            parts.append(f"{stage['stage']}{in_round} {ended}/{stage['pieces']}")
    if s.dead or s.lost:
        parts.append(f"{s.dead + s.lost} dead")
    if s.running:
        parts.append(f"{s.running} running")
    if s.queued:
        parts.append(f"{s.queued} queued")
    if s.parked_items:
        parts.append(f"{s.parked_items} parked")
    if s.cancelled_items:
        parts.append(f"{s.cancelled_items} cancelled")
    if s.rate:
        parts.append(f"{s.rate * 60:.0f}/min")
    if s.eta is not None and not s.finished:
        parts.append(f"ETA {duration(s.eta)}")
    spent = s.spent if s.spent is not None else None
    if s.unpriced:
        parts.append("spent: unpriced")
    elif spent is not None:
        of = f" of {dollars(s.budget)}" if s.budget is not None else ""
        cut = money(s.estimated) or Decimal(0)
        if cut:
            # A call cut off mid-call is counted at its worst case (the budget must hold
            # whatever the provider bills), which can dwarf what was billed: the line
            # says which part is known and which is a bound.
            billed = (money(spent) or Decimal(0)) - cut
            parts.append(f"spent {dollars(billed)} + up to {dollars(cut)} cut short{of}")
        else:
            parts.append(f"spent {dollars(spent)}{of}")
    if s.waited_for_limits:
        parts.append(f"waited {duration(s.waited_for_limits)} for limits")
    return ", ".join(parts)


def parked_lines(s: BatchStatus) -> list[str]:
    """Why the batch stopped and what to run next."""
    if s.parked == "cancelled":
        return [f"batch {s.batch} was cancelled: {s.documents - s.done} documents not answered"]
    if not s.parked:
        return []
    lines = [f"batch {s.batch} is parked: {s.parked_reason or s.parked}"]
    if s.next:
        lines.append(f"to continue: {s.next}")
    return lines


def outcome(s: BatchStatus) -> int:
    if s.parked:
        return PARKED
    if s.dead or s.lost:
        return SOME_DEAD
    return ALL_ANSWERED


class Display:
    """A rich bar on a terminal, else a plain line every PLAIN_EVERY seconds."""

    def __init__(self, err: Console, batch: str) -> None:
        self.err, self.batch = err, batch
        self.live = err.is_terminal
        self._last_line = 0.0
        self.bar: Progress | None = None
        if self.live:
            self.bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(bar_width=12),  # the line beside it is what tells: it gets the room
                TextColumn("{task.fields[line]}"),
                console=err,
                transient=False,
            )
            self.task = self.bar.add_task(batch, total=None, line="starting")

    def __enter__(self) -> Display:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def update(self, s: BatchStatus) -> None:
        line = summary(s)
        if self.bar is not None:
            total = max(1, s.documents)
            self.bar.update(self.task, total=total, completed=s.done + s.dead + s.lost,
                            line=line)  # fmt: skip
            return
        now = time.monotonic()
        if now - self._last_line >= PLAIN_EVERY or s.finished or s.parked:
            self._last_line = now
            self.err.print(f"batch {self.batch}: {line}", soft_wrap=True)


async def follow(
    app: App,
    batch: str,
    err: Console,
    *,
    interval: float = 0.5,
    run_workers: Callable[[], Coroutine[Any, Any, Any]] | None = None,
    stop_workers: Callable[[], None] | None = None,
) -> tuple[int, BatchStatus]:
    """Watch ``batch`` until it is finished, parked or interrupted (SIGINT); returns the
    exit code and the last status. ``run_workers``: workers run here meanwhile, stopped
    (``stop_workers``) when following ends."""
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, interrupted.set)
    workers: asyncio.Task[Any] | None = asyncio.create_task(run_workers()) if run_workers else None
    try:
        with Display(err, batch) as display:
            while True:
                status = await batch_status(app, batch)
                display.update(status)
                if status.finished or status.parked or interrupted.is_set():
                    break
                if workers is not None and workers.done():
                    workers.result()  # a worker that died: its error, not a hang
                    workers = None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(interrupted.wait(), interval)
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
        if workers is not None:
            if stop_workers is not None:
                stop_workers()
            await workers
    if interrupted.is_set():
        # The calls running here finished in the grace period (or were handed back):
        # the counts and the spend as they stand now, not as they stood at Ctrl-C.
        status = await batch_status(app, batch)
        left = status.documents - status.done - status.dead - status.lost - status.cancelled_items
        err.print(
            f"interrupted: batch {batch} has {left} documents still to answer; workers"
            f" elsewhere (`herd worker`) finish them. Follow it with `herd eval wait {batch}`.",
            soft_wrap=True,
        )
        return INTERRUPTED, status
    for line in parked_lines(status):
        err.print(line, soft_wrap=True)
    if status.dead or status.lost:
        err.print(
            f"batch {batch}: {status.dead + status.lost} of {status.documents} documents failed"
            f" (`herd eval show {batch}` names them; `herd dlq list` has their errors)",
            soft_wrap=True,
        )
        for f in status.failures[:10]:
            err.print(f"  {f['path']}: {f['error']}", soft_wrap=True)
    return outcome(status), status


def print_stages(stages: list[dict[str, Any]]) -> None:
    """A batch in stages, a row per stage: pieces answered of those made so far, failed,
    answered from the cache, calls paid and their cost."""
    table = Table(title="stages", title_justify="left", box=None)
    for col in ("stage", "kind", "done", "failed", "cached", "calls", "cost"):
        table.add_column(col, justify="left" if col in ("stage", "kind") else "right")
    for s in stages:
        # A reduce larger than its context runs in rounds: the last one made.
        kind = f"{s['kind']}, round {s['round']}" if s.get("round", 1) > 1 else s["kind"]
        table.add_row(s["stage"], kind, f"{s['done']:,}/{s['pieces']:,}",
                      f"{s['failed']:,}", f"{s['cached']:,}", f"{s['calls']:,}",
                      dollars(s["cost"]) if s["calls"] else "")  # fmt: skip
    console.out.print(table)


def scope_label(u: dict[str, Any]) -> str:
    """A limit's scope, its key named by its variable on a line of its own where
    HERD_LIMITS names it (a pool's keys told apart, and not folded at 80 columns)."""
    scope, key, ident = str(u["scope"]), u.get("key"), u.get("key_id")
    if key and ident and key != ident and scope.endswith(":" + ident):
        return f"{scope[: -len(ident) - 1]}\n  key {key}"
    return scope


def print_shares(status: BatchStatus) -> None:
    """The batches sharing each fleet limit now: weight, share of its use, fair share."""
    shown: set[tuple[str, tuple[str, ...]]] = set()
    for u in status.limit_usage:
        if len(u["shares"]) < 2 and not (status.batch and u["shares"]):
            continue
        # A pool's keys are shared alike (the limiter spreads each batch's calls over
        # them): one table per scope and set of batches, not one per key.
        scope = scope_label(u).split("\n")[0]
        sharing = (scope, tuple(sorted(f["batch"] for f in u["shares"])))
        if sharing in shown:
            continue
        shown.add(sharing)
        table = Table(title=f"shares of {scope}", title_justify="left", box=None)
        for col in ("batch", "weight", "share now", "fair share", ""):
            table.add_column(col, justify="left" if col == "batch" else "right",
                             overflow="fold")  # fmt: skip
        for f in u["shares"]:
            mark = "this batch" if f["batch"] == status.batch else ""
            mark = mark or ("waiting" if f["waiting"] else "")
            table.add_row(f["batch"], f"{f['weight']:g}", f"{f['share']:.0%}",
                          f"{f['fair']:.0%}", mark)  # fmt: skip
        console.out.print(table)


def print_status(status: BatchStatus) -> None:
    """A batch's status on stdout: progress, why it waits, spend, limits, the ledger."""
    console.out.print(summary(status), soft_wrap=True)
    for line in parked_lines(status):
        console.out.print(line, soft_wrap=True)
    if status.budget is not None or status.spent:
        parts = [
            f"budget {dollars(status.budget, unpriced='none')}",
            f"spent {dollars(status.spent)}",
            f"reserved {dollars(status.reserved)}",
        ]
        if status.estimated:
            parts.append(f"of which {dollars(status.estimated)} estimated (calls cut off"
                         " mid-call, at their worst case)")  # fmt: skip
        console.out.print(", ".join(parts), soft_wrap=True)
    if status.unpriced:
        console.out.print(
            f"unpriced models: {', '.join(status.unpriced)} (add them to"
            " HERD_PRICES); their calls are counted, not priced"
        )
    if status.limits:
        console.out.print(
            "batch limits " + ", ".join(f"{k} {v}" for k, v in sorted(status.limits.items()))
        )
    if status.limit_usage:
        use = Table(title="provider limits (fleet-wide)", title_justify="left", box=None)
        for col in ("scope", "requests", "tokens", "in flight", "waited", "429s"):
            use.add_column(col, justify="left" if col == "scope" else "right", overflow="fold")
        for u in status.limit_usage:
            lim = u["limit"]

            def of(now: float, name: str, lim: dict[str, Any] = lim) -> str:
                return f"{now:,.0f}/{lim[name]:,}" if lim.get(name) else f"{now:,.0f}"

            # On a line of its own, as a pool's key is: beside the scope it folded the
            # scope's name at 80 columns.
            paused = f"\n  paused {u['paused_for']:,.0f} s" if u["paused_for"] else ""
            use.add_row(scope_label(u) + paused, of(u["requests_now"], "rpm"),
                        of(u["tokens_now"], "tpm"), of(u["in_flight"], "max_concurrent"),
                        f"{u['wait_seconds']:.1f} s", f"{u['rate_limited']:,}")  # fmt: skip
        console.out.print(use)
        print_shares(status)
    if status.stages:
        print_stages(status.stages)
    led = status.ledger
    table = Table(title="cost ledger", title_justify="left", box=None)
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
        row = led.get(kind)
        if row is None:
            continue
        paid = kind in ("call", "lost", "failed", "cut_short")
        cost = dollars(row["cost"]) if paid else ""
        if kind in ("lost", "failed", "cut_short") and row["cost"] is not None:
            cost += " (estimate)"
        table.add_row(label, f"{row['n']:,}", f"{row['input_tokens']:,}",
                      f"{row['output_tokens']:,}", cost)  # fmt: skip
    if led:
        console.out.print(table)
    if len(status.keys) > 1:  # a key pool spread the calls: who paid for what
        by_key = Table(title="paid by key", title_justify="left", box=None)
        for col in ("key", "calls", "cost"):
            by_key.add_column(col, justify="left" if col == "key" else "right")
        for k in status.keys:
            by_key.add_row(k["key"], f"{k['calls']:,}", dollars(k["cost"]))
        console.out.print(by_key)
    pc = status.provider_cache
    if pc.get("cached_input_tokens") or pc.get("cache_write_tokens"):
        saved = pc.get("saved")
        console.out.print(
            f"provider cache: {pc['cached_input_tokens']:,} input tokens read from it,"
            f" {pc['cache_write_tokens']:,} written"
            + (f", {dollars(saved)} saved" if saved is not None else "")
            + " (apart from herd's cache)",
            soft_wrap=True,
        )
