"""Submitting a batch in stages: the whole pipeline checked before anything is stored
or paid for, each document split here (a split costs no call), its first stage's pieces
stored with their locations and enqueued, one job per piece."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from herd.app import App
from herd.cache.keys import normalize_document
from herd.config import Settings
from herd.errors import InvalidInput
from herd.jsonvalue import check_text
from herd.llm.documents import DocumentError
from herd.llm.eval import functions
from herd.llm.eval.pipeline import Pipeline, per_piece
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.spec import LOCAL, Caller
from herd.llm.eval.split import join_pages, read_pages, split
from herd.llm.eval.stages import Q, item_spec, on, put_step_input, send_unsent, text_hash
from herd.llm.eval.store import EvalStore
from herd.llm.eval.submit import SubmitReport, check_paths, check_submission


def check_pipeline(
    pipe: Pipeline,
    settings: Settings,
    *,
    budget: float | None = None,
    limits: dict[str, Any] | None = None,
    batch: str | None = None,
    fallbacks: Sequence[str] = (),
) -> tuple[float | None, dict[str, int] | None]:
    """Every stage's call checked as one submission's (its schema, params, provider key,
    price where a budget needs one, the fallbacks its calls may move to, what the Batch
    API cannot keep for a stage through it); InvalidInput names the stage."""
    checked: tuple[float | None, dict[str, int] | None] = (None, None)
    for stage, spec in zip(pipe.calls, pipe.check(settings), strict=True):
        try:
            checked = check_submission(spec, settings, budget=budget, limits=limits,
                                       batch=batch, fallbacks=fallbacks,
                                       batch_api=stage.batch_api)  # fmt: skip
        except InvalidInput as exc:
            raise InvalidInput(f"stage {stage.name!r}: {exc}", field=exc.field) from None
    return checked


async def _store(
    app: App,
    pipe: Pipeline,
    batch: str,
    docs: list[tuple[str, list[str]]],
    priority: int,
) -> int:
    """The documents (name, pages) split and stored, their first stage's pieces enqueued
    (or, through the Batch API, handed to one gathering job); returns the pieces."""
    rt = await EvalRuntime.of(app)
    first = pipe.first
    window = pipe.window_tokens()
    for stage in pipe.calls:
        await rt.store.put_spec(pipe.spec(stage))
    await rt.store.execute(
        Q["put_pipeline"], {"hash": pipe.hash, "pipeline": Jsonb(pipe.to_json())}
    )
    made = 0
    for name, pages in docs:
        text, ranges = join_pages(pages)
        # A stage per document first (a chain) reads the whole document: its one input.
        pieces = split(text, pipe.split if per_piece(first) else None, window, ranges)
        async with rt.store.transaction() as conn:
            await _put_doc(conn, batch, name, text, pipe, item_spec(pipe))
            await put_step_input(conn, pipe, first, batch, name,
                                 [(p.text, p.loc) for p in pieces])  # fmt: skip
            if per_piece(first):
                await on(conn, "put_fanin", b=batch, path=name, stage=first.name, n=len(pieces))
        made += len(pieces)
    await send_unsent(app, rt, pipe, batch, None, priority, gather_now=True)
    return made


async def _put_doc(
    conn: Any, batch: str, name: str, text: str, pipe: Pipeline, spec_hash: str
) -> None:
    """The document's text and its one item (where its final answer lands)."""
    doc = text_hash(text)
    await EvalStore.on(conn, "put_documents", hashes=[doc], texts=[text])
    await on(conn, "put_doc_item", b=batch, path=name, key=f"pipeline:{pipe.hash[:16]}:{doc}",
             doc=doc, spec=spec_hash, pipeline=pipe.hash)  # fmt: skip


async def _new_batch(
    app: App, batch: str | None, budget: float | None, limits: dict[str, int] | None,
    caller: Caller, fallbacks: Sequence[str] = (),
) -> str:  # fmt: skip
    """The batch's row made; a pipeline's batch is new (a re-run takes another name:
    its unchanged stages come from the cache)."""
    name = batch or f"eval-{uuid.uuid4().hex[:8]}"
    check_text(name, "batch")
    rt = await EvalRuntime.of(app)
    if await rt.store.exists(name):
        raise InvalidInput(
            f"batch: {name!r} exists; a pipeline runs in a batch of its own: submit under"
            " another name (what did not change is answered from the cache)",
            field="batch",
        )
    await rt.store.put_batch(name, budget=budget, limits=limits, owner=caller.owner)
    if fallbacks:  # every stage's calls read them (herd.llm.eval.task.answer)
        await rt.store.put_fallbacks(name, list(fallbacks))
    return name


async def submit_pipeline(
    app: App,
    paths: Iterable[Path],
    pipe: Pipeline,
    *,
    batch: str | None = None,
    priority: int = 0,
    budget: float | None = None,
    limits: dict[str, Any] | None = None,
    caller: Caller = LOCAL,
    progress: Callable[[int, int], None] | None = None,
    fallbacks: Sequence[str] = (),
) -> SubmitReport:
    """Split and enqueue the documents under ``paths`` through ``pipe``; the unreadable
    ones are reported, not refused. Refused (InvalidInput) before anything is stored:
    a stage's call, a budget or limit, a missing path, an existing batch name."""
    budget, checked = check_pipeline(pipe, app.settings, budget=budget, limits=limits,
                                     batch=batch, fallbacks=fallbacks)  # fmt: skip
    functions.check(app, pipe)
    files = check_paths(paths)
    if not files:
        raise InvalidInput("no document (.txt, .md, .pdf) under the paths given", field="paths")
    report = SubmitReport(await _new_batch(app, batch, budget, checked, caller, fallbacks))
    docs: list[tuple[str, list[str]]] = []
    for n, path in enumerate(files, 1):
        try:
            docs.append((str(path), read_pages(path)))
        except DocumentError as exc:
            report.errors.append(str(exc))
        if progress:
            progress(n, len(files))
    report.queued = await _store(app, pipe, report.batch, docs, priority)
    return report


async def submit_pipeline_texts(
    app: App,
    pipe: Pipeline,
    documents: dict[str, str],
    *,
    batch: str | None = None,
    priority: int = 0,
    budget: float | None = None,
    limits: dict[str, Any] | None = None,
    caller: Caller = LOCAL,
    fallbacks: Sequence[str] = (),
) -> SubmitReport:
    """The same for texts (name -> text), as the HTTP API gives them; form feeds are
    page breaks."""
    budget, checked = check_pipeline(pipe, app.settings, budget=budget, limits=limits,
                                     batch=batch, fallbacks=fallbacks)  # fmt: skip
    functions.check(app, pipe)
    for i, (name, text) in enumerate(documents.items()):
        check_text(name, f"documents[{i}].name")
        check_text(text, f"documents[{i}].text")
    report = SubmitReport(await _new_batch(app, batch, budget, checked, caller, fallbacks))
    docs = [(name, [normalize_document(p) for p in text.split("\f")])
            for name, text in documents.items()]  # fmt: skip
    report.queued = await _store(app, pipe, report.batch, docs, priority)
    return report
