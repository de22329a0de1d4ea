"""`herd cache …`: the exact result cache and the semantic query cache."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from herd import console
from herd.app import App
from herd.llm.eval import EvalRuntime
from herd.semantic.runtime import backend_clear, backend_stats

cache_cli = typer.Typer(
    no_args_is_help=True, help="The exact result cache and the semantic query cache."
)


@cache_cli.command("stats")
def cache_stats(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print them as JSON.")] = False,
) -> None:
    """Entries, hits, misses and computations of the exact and the semantic cache."""

    async def work(app: App) -> dict[str, Any]:

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
        str | None,
        typer.Option(metavar="NAME", help="One exact-cache namespace; default: all."),
    ] = None,
    collection: Annotated[
        str | None,
        typer.Option(
            metavar="NAME", help="Only the semantic cache's answers about this collection."
        ),
    ] = None,
    which: Annotated[str, typer.Option(metavar="CACHE", help="exact, semantic or both.")] = "both",
) -> None:
    """Remove cached results (the next request for them computes again)."""
    if which not in ("exact", "semantic", "both"):
        raise typer.BadParameter("use exact, semantic or both", param_hint="--which")
    if collection is not None:
        which = "semantic"  # the exact cache does not know collections

    async def work(app: App) -> tuple[int, int]:

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
