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
    """Entries, hits and misses of the exact and the semantic cache.

    Also the exact cache's computations and the semantic cache's guard rejections,
    lock waits, evictions and lookup times.
    """

    async def work(app: App) -> dict[str, Any]:

        return {
            "exact": await (await EvalRuntime.of(app)).cache.store.stats(),
            "semantic": await backend_stats(app),
        }

    stats = console.run(console.opts(ctx), work)
    if as_json:
        console.print_json(stats)
        return
    _print_exact_stats(stats["exact"])
    _print_semantic_stats(stats["semantic"])


# Counters as columns: short words, so that a namespace and all of them fit 80 columns.
_EXACT = {"entries": "entries", "hits": "hits", "misses": "misses", "computed": "computed",
          "waited": "waited", "stale": "stale", "early_refresh": "early",
          "errors": "errors"}  # fmt: skip
_SEMANTIC = {"entries": "entries", "hits": "hits", "misses": "misses", "hit_rate": "hit rate",
             "guard_rejections": "guard rejections", "lock_waits": "lock waits",
             "stampedes_suppressed": "stampedes suppressed", "stale": "stale answers",
             "evictions": "evictions"}  # fmt: skip


def _print_exact_stats(stats: dict[str, dict[str, Any]]) -> None:
    if not stats:
        console.out.print("exact cache: no entries or lookups yet")
        return
    table = Table(
        title="exact cache", title_justify="left", box=None, pad_edge=False, header_style="bold"
    )
    table.add_column("namespace", overflow="fold", min_width=9)
    for label in _EXACT.values():
        table.add_column(label, justify="right", no_wrap=True)
    for ns, counters in sorted(stats.items()):
        table.add_row(ns, *[f"{counters.get(c, 0):,}" for c in _EXACT])
    console.out.print(table)
    console.out.print(
        "early: entries refreshed before they expired; waited: lookups that waited for"
        " another's computation",
        style="dim",
    )


def _print_semantic_stats(stats: dict[str, dict[str, Any]]) -> None:
    """One column per cache, one row per figure: eleven figures side by side do not
    fit 80 columns, and there are few caches."""
    if not stats:
        console.out.print("semantic cache: no entries or lookups yet")
        return
    table = Table(title="semantic cache", title_justify="left", box=None, header_style="bold",
                  pad_edge=False)  # fmt: skip
    table.add_column("", no_wrap=True)
    for name in stats:
        table.add_column(name, justify="right", overflow="fold")
    for key, label in _SEMANTIC.items():
        table.add_row(label, *[
            f"{f['hit_rate']:.1%}" if key == "hit_rate" else f"{f.get(key, 0):,}"
            for f in stats.values()
        ])  # fmt: skip
    table.add_row("p50 lookup", *[_quantile(f["lookup_seconds"], 0.5) for f in stats.values()])
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
