"""Submitting a batch: everything checked once, before anything is stored or paid for,
then stored and enqueued, synchronously (a job per distinct document) or through the
provider's Batch API (a job per chunk of keys). The CLI, the HTTP API and Python
callers all come through here."""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from herd.app import App
from herd.cache.keys import normalize_document
from herd.config import Settings
from herd.errors import ConfigError, InvalidInput
from herd.jsonvalue import canonical, check, check_text
from herd.limits import load as load_limits
from herd.llm.documents import DocumentError, find_documents, read_document
from herd.llm.errors import MissingAPIKey
from herd.llm.eval import control, fallback
from herd.llm.eval.runtime import EvalRuntime, prices_in_force
from herd.llm.eval.spec import (
    LOCAL,
    QUEUE,
    SUBMIT_TASK,
    TASK,
    Caller,
    EvalSpec,
    check_budget,
    check_limits,
    in_turns,
)
from herd.llm.pricing import PriceTable
from herd.llm.providers import registry
from herd.llm.providers.openai_batch import OpenAIBatch
from herd.queue.base import EnqueueResult

log = logging.getLogger("herd.eval")

# A chunk's keys travel in its jobs' payloads: a key and its JSON quoting, with room
# for the rest of the payload, so a chunk fits HERD_MAX_PAYLOAD_BYTES.
KEY_BYTES = 70
PAYLOAD_SPARE = 4096


@dataclass
class SubmitReport:
    batch: str
    queued: int = 0
    deduplicated: int = 0
    errors: list[str] = field(default_factory=list)
    job_ids: list[int] = field(default_factory=list)


_warned_unpriced: set[str] = set()


def check_submission(
    spec: EvalSpec,
    settings: Settings,
    *,
    budget: float | None = None,
    limits: dict[str, Any] | None = None,
    batch_api: bool = False,
    batch: str | None = None,
    prices: PriceTable | None = None,
    fallbacks: Sequence[str] = (),
) -> tuple[float | None, dict[str, int] | None]:
    """Everything a submission can be refused for, checked once before anything is
    stored: the spec against the settings (and its schema, when it was made), the
    budget and limits, the provider's key, the model's price where a budget needs it,
    and what the Batch API cannot keep. Returns the checked budget and limits."""
    spec.check(settings)
    checked_budget = check_budget(budget)
    checked_limits = check_limits(limits)
    if batch is not None:
        check_text(batch, "batch")
    check(asdict(spec), what="spec")
    kind = registry.kind(spec.provider)
    if batch_api:
        if kind.batch is None:
            raise InvalidInput(
                f"batch_api: the {spec.provider} Batch API is not supported yet"
                f" (supported: {', '.join(n for n in registry.names() if registry.kind(n).batch)});"
                " submit without it",
                field="batch_api",
            )
        if checked_budget is not None or checked_limits:
            # The batch path reserves nothing against a budget and the provider paces
            # its own batch: refused rather than silently not kept.
            raise InvalidInput(
                "batch_api: a budget or rpm/tpm/max_concurrent limits are not kept through"
                " the Batch API yet; submit without one or the other",
                field="batch_api",
            )
    # HERD_LIMITS read here too: a key of a pool that is not set (or any other fault of
    # the file) is refused now, before anything is stored, not by the first worker call.
    limits_file = None
    if settings.limits_path:
        try:
            limits_file = load_limits(settings.limits_path, providers=registry.names())
        except ConfigError as exc:
            raise InvalidInput(f"HERD_LIMITS: {exc}", field="limits") from None
    prices = prices or prices_in_force()
    fallback.check(spec, fallbacks, budget=checked_budget, batch_api=batch_api, prices=prices,
                   limits_file=limits_file)  # fmt: skip
    price = prices.lookup(spec.model, spec.provider)
    if price is None and checked_budget is not None:
        raise InvalidInput(
            f"budget: model {spec.model!r} has no price, so a budget cannot be kept; add it"
            " to the price table (HERD_PRICES) or submit without --budget",
            field="budget",
        )
    if price is None and spec.model not in _warned_unpriced:
        _warned_unpriced.add(spec.model)
        log.warning(
            "model %r has no price: its calls are counted but shown as unpriced, not $0"
            " (add it to HERD_PRICES)", spec.model,
        )  # fmt: skip
    # A pool's keys are the batch's keys: the provider's own variable is not needed.
    if limits_file is None or not limits_file.pool_for(spec.provider, spec.model):
        try:
            kind.check_key()
        except MissingAPIKey as exc:
            raise InvalidInput(str(exc), field="provider") from None
    return checked_budget, checked_limits


def chunk_size(app: App, api_max: int = OpenAIBatch.max_requests) -> int:
    """Requests per provider batch: the provider's limit, or what a payload can carry."""
    return max(1, min(api_max, (app.settings.max_payload_bytes - PAYLOAD_SPARE) // KEY_BYTES))


def _rows(spec: EvalSpec, batch: str, items: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(name, document hash, key) of each item; the characters of every part checked
    before a key is hashed from them."""
    check_text(batch, "batch")
    check(asdict(spec), what="spec")
    for i, (name, text) in enumerate(items):
        check_text(name, f"documents[{i}].name")
        check_text(text, f"documents[{i}].text")
    return [(n, hashlib.sha256(t.encode()).hexdigest(), spec.key(t)) for n, t in items]


async def enqueue_documents(
    app: App,
    spec: EvalSpec,
    batch: str,
    items: list[tuple[str, str]],
    *,
    priority: int = 0,
    budget: float | None = None,
    limits: dict[str, Any] | None = None,
    checked: bool = False,
    caller: Caller = LOCAL,
    fallbacks: Sequence[str] = (),
) -> list[EnqueueResult]:
    """One job per (name, normalized text); identical evaluations share a job.

    Stores the batch's row (its budget and limits, where given), the documents, the
    batch's items and a dedup ledger row for each document that joined an existing
    job, so ``herd eval status`` sees it all. ``checked``: check_submission ran.
    ``caller``: who submits; a batch another caller made is refused (BatchNameTaken).
    """
    rows = _rows(spec, batch, items)
    if not checked:
        budget, limits = check_submission(spec, app.settings, budget=budget, limits=limits,
                                          batch=batch, fallbacks=fallbacks)  # fmt: skip
    if not items:
        return []
    rt = await EvalRuntime.of(app)
    # Before the jobs: a worker that claims one finds the budget already in force.
    await rt.store.put_batch(batch, budget=budget, limits=limits, owner=caller.owner)
    if budget is not None:  # raised by this submission: parked jobs may resume
        await control.set_budget(app, batch, budget, caller=caller)
    await rt.store.put_spec(spec)
    await rt.store.put_documents(
        {d: text for (_, d, _), (_, text) in zip(rows, items, strict=True)}
    )
    results = await app.enqueue_many(
        TASK,
        [
            {
                "batch": batch,
                "path": p,
                "doc": d,
                "spec": spec.hash,
                "key": k,
                **({"fallbacks": list(fallbacks)} if fallbacks else {}),
            }
            for p, d, k in rows
        ],
        queue=QUEUE,
        priority=priority,
        dedup_keys=[k for _, _, k in rows],
        **in_turns(batch, len(rows)),
    )
    await rt.store.put_items(
        batch, spec.hash, [(p, k, r.job_id, d) for (p, d, k), r in zip(rows, results, strict=True)]
    )
    for (_, _, k), r in zip(rows, results, strict=True):
        if not r.created:
            await rt.store.record(batch=batch, job_id=r.job_id, key=k, kind="dedup",
                                  model=spec.model, provider=spec.provider)  # fmt: skip
    return results


async def in_flight(app: App, spec: EvalSpec, keys: list[str]) -> list[tuple[str, int]]:
    """(key, job) for each of ``keys`` that a pending or running job already serves."""
    if not keys:
        return []
    rt = await EvalRuntime.of(app)
    rows = await rt.store.execute("in_flight", {"spec": spec.hash, "keys": keys})
    if not rows:
        return []
    found = await app.broker.get_jobs(sorted({job for _, job in rows}))
    jobs = {j.id: j for j in found}
    return [(k, job) for k, job in rows if job in jobs and jobs[job].status.active]


async def enqueue_batch_documents(
    app: App,
    spec: EvalSpec,
    batch: str,
    items: list[tuple[str, str]],
    *,
    priority: int = 0,
    checked: bool = False,
    caller: Caller = LOCAL,
) -> list[EnqueueResult]:
    """Like ``enqueue_documents``, but the keys the exact cache does not hold go into
    one batch-submit job per chunk; the cached ones take the synchronous path (their
    jobs find the answer in the cache and record it). One result per item."""
    rows = _rows(spec, batch, items)
    if not checked:
        check_submission(spec, app.settings, batch_api=True, batch=batch)
    if not items:
        return []
    rt = await EvalRuntime.of(app)
    # Before anything is enqueued: a batch of another caller is refused here.
    await rt.store.put_batch(batch, budget=None, limits=None, owner=caller.owner)
    cached = {k for k in {k for _, _, k in rows} if await rt.cache.get(k) is not None}
    out: dict[int, EnqueueResult] = {}
    sync = [i for i, (_, _, k) in enumerate(rows) if k in cached]
    if sync:
        done = await enqueue_documents(
            app, spec, batch, [items[i] for i in sync], priority=priority, checked=True,
            caller=caller,
        )  # fmt: skip
        out.update(zip(sync, done, strict=True))
    rest = [i for i in range(len(rows)) if i not in out]
    if rest:
        await rt.store.put_spec(spec)
        await rt.store.put_documents({rows[i][1]: items[i][1] for i in rest})
        keys = list(dict.fromkeys(rows[i][2] for i in rest))
        # A key already in flight (in a provider batch of an earlier submission, or a
        # job) joins it rather than be sent, and paid for, again.
        job_of: dict[str, EnqueueResult] = {
            k: EnqueueResult(job_id, False) for k, job_id in (await in_flight(app, spec, keys))
        }
        keys = [k for k in keys if k not in job_of]
        size = chunk_size(app)
        for start in range(0, len(keys), size):
            chunk = keys[start : start + size]
            chunk_id = hashlib.sha256(canonical([batch, spec.hash, chunk]).encode()).hexdigest()
            result = await app.enqueue(
                SUBMIT_TASK,
                {"batch": batch, "spec": spec.hash, "chunk": chunk_id, "keys": chunk},
                queue=QUEUE,
                priority=priority,
                dedup_key=f"batchapi:{chunk_id}",
            )
            job_of.update(dict.fromkeys(chunk, result))
        await rt.store.put_items(
            batch, spec.hash, [(rows[i][0], rows[i][2], job_of[rows[i][2]].job_id, rows[i][1])
                               for i in rest],
        )  # fmt: skip
        seen: set[str] = set()
        for i in rest:
            key = rows[i][2]
            r = job_of[key]
            # A key's first document makes the request; the others share its answer.
            out[i] = EnqueueResult(r.job_id, r.created and key not in seen)
            seen.add(key)
    return [out[i] for i in range(len(rows))]


def check_paths(paths: Iterable[Path]) -> list[Path]:
    """The documents under ``paths``, every path checked to exist first: a mistake in
    one is refused (InvalidInput) before a batch is made."""
    paths = list(paths)
    for path in paths:
        if not path.exists():
            raise InvalidInput(f"{path}: no such file or directory", field="paths")
    try:
        return list(find_documents(paths))
    except DocumentError as exc:
        raise InvalidInput(str(exc), field="paths") from None


async def submit(
    app: App,
    paths: Iterable[Path],
    spec: EvalSpec,
    *,
    batch: str | None = None,
    priority: int = 0,
    progress: Callable[[int, int], None] | None = None,
    chunk: int = 200,
    budget: float | None = None,
    limits: dict[str, Any] | None = None,
    batch_api: bool = False,
    caller: Caller = LOCAL,
    fallbacks: Sequence[str] = (),
) -> SubmitReport:
    """Enqueue one evaluation job per readable document; report the unreadable ones.

    Refused (InvalidInput) before anything is stored: a path that does not exist, a
    folder with no document, and all check_submission refuses. ``budget``: USD the
    batch's calls may cost (None: unchanged, none for a new batch); ``limits``: rpm,
    tpm and max_concurrent, stored with the batch. ``batch_api``: through the
    provider's Batch API at half the price (herd.llm.eval.batchapi). ``progress``:
    called with (documents read, of all)."""
    budget, limits = check_submission(spec, app.settings, budget=budget, limits=limits,
                                      batch_api=batch_api, batch=batch,
                                      fallbacks=fallbacks)  # fmt: skip
    files = check_paths(paths)
    if not files:
        raise InvalidInput("no document (.txt, .md, .pdf) under the paths given", field="paths")
    if batch_api:
        chunk = max(chunk, chunk_size(app))
    report = SubmitReport(batch or f"eval-{uuid.uuid4().hex[:8]}")
    for start in range(0, len(files), chunk):
        items: list[tuple[str, str]] = []  # path, normalized text
        for path in files[start : start + chunk]:
            try:
                items.append((str(path), normalize_document(read_document(path))))
            except DocumentError as exc:
                report.errors.append(str(exc))
        if batch_api:
            enqueued = await enqueue_batch_documents(
                app, spec, report.batch, items, priority=priority, checked=True, caller=caller
            )
        else:
            enqueued = await enqueue_documents(
                app, spec, report.batch, items, priority=priority, budget=budget,
                limits=limits, checked=True, caller=caller, fallbacks=fallbacks,
            )  # fmt: skip
        for r in enqueued:
            report.job_ids.append(r.job_id)
            if r.created:
                report.queued += 1
            else:
                report.deduplicated += 1
        if progress:
            progress(min(len(files), start + chunk), len(files))
    return report


async def submit_texts(
    app: App,
    spec: EvalSpec,
    documents: dict[str, str],
    *,
    batch: str | None,
    priority: int = 0,
    budget: float | None = None,
    limits: dict[str, int] | None = None,
    batch_api: bool = False,
    caller: Caller = LOCAL,
    fallbacks: Sequence[str] = (),
) -> SubmitReport:
    """One evaluation job per document (name -> text), stored as ``submit`` stores
    files, so status and results see API batches alike. ``caller``: who submits (a
    batch another caller made is refused: BatchNameTaken)."""
    budget, limits = check_submission(spec, app.settings, budget=budget, limits=limits,
                                      batch_api=batch_api, batch=batch,
                                      fallbacks=fallbacks)  # fmt: skip
    report = SubmitReport(batch or f"eval-{uuid.uuid4().hex[:8]}")
    items = [(path, normalize_document(text)) for path, text in documents.items()]
    if batch_api:
        results = await enqueue_batch_documents(
            app, spec, report.batch, items, priority=priority, checked=True, caller=caller
        )
    else:
        results = await enqueue_documents(app, spec, report.batch, items, priority=priority,
                                          budget=budget, limits=limits, checked=True,
                                          caller=caller, fallbacks=fallbacks)  # fmt: skip
    report.job_ids = [r.job_id for r in results]
    report.queued = sum(r.created for r in results)
    report.deduplicated = len(results) - report.queued
    return report
