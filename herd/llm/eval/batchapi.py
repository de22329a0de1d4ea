"""Evaluations through a provider's Batch API: half the price, answers within 24 hours.

A submission (herd.llm.eval.submit) stores documents and items as the synchronous
path does; the keys the exact cache cannot answer, deduplicated, go into one
``herd.eval.batch_submit`` job per chunk of a (batch, spec) instead of a job per key.

Exactly once through crashes. A provider batch submitted twice is billed twice, and
a worker can die between "created the batch" and "recorded that I did". So the
submit job first records, fenced by its lease, a handle for its chunk (a row of
herd_eval_provider_batches, its time taken from the store's clock); the handle names
the uploaded file and is the provider batch's metadata (Anthropic's batches have
neither: every custom_id carries it). Whoever runs the job after a takeover looks the
handle up at the provider before making anything, reuses the file and batch found, and
uploads or creates only what is missing; a run that has just recorded the handle knows
nothing is there yet. A SIGKILL at any step therefore never makes a second provider
batch (tests/llm/test_batch_api.py kills at each, through a provider registered by its
worker's app).

Polling is a job, not a blocked worker: ``herd.eval.batch_poll`` checks the provider
batch and hands itself back (Snooze, no attempt counted), backing off from
POLL_FIRST to POLL_MAX seconds. Once it has ended, the answers go to the exact
cache, the items and the ledger (at the batch price) in one fenced transaction.
Requests that errored, expired or answered outside the schema are retried once, as
HERD_EVAL_BATCH_RETRY says: through the synchronous path (a herd.eval job, which
repairs and dead-letters as usual; the default) or in a new provider batch, whose own
failures are dead-lettered with the provider's error.

``herd eval cancel`` cancels the provider batches too: a submit job that finds its
batch cancelled before it created anything creates nothing, and a poll job asks the
provider to cancel (again: it may have been created after the command looked), then
files what the provider answered before it stopped, which is billed.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from psycopg.types.json import Jsonb

from herd import telemetry
from herd.app import App
from herd.context import JobContext
from herd.errors import Fatal, Retry, Snooze
from herd.llm.completion import Usage
from herd.llm.eval import ledger, pipebatch
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.spec import (
    POLL_TASK,
    QUEUE,
    SUBMIT_TASK,
    TASK,
    TURNS,
    EvalSpec,
    in_turns,
    turns,
    validate_answer,
)
from herd.llm.eval.store import EvalStore
from herd.llm.eval.task import fenced
from herd.llm.pricing import Price
from herd.llm.providers.batch import BatchAPI, Found, ProviderBatch, Request
from herd.queue.base import Job

log = logging.getLogger("herd.eval")

POLL_FIRST = 2.0
POLL_MAX = 60.0
RACE_RETRY = 2.0  # seconds before a submit job that ran before its items were stored runs again


def new_handle(at: float | None = None) -> str:
    """A chunk's handle: its creation time in milliseconds (12 hex), then 20 random hex.

    The time lets a provider whose batches carry no metadata (Anthropic) stop looking
    for the handle's batch among those made before it. The submit job takes the time
    from the store's clock (queries.sql, record_handle); this is for tools and tests."""
    ms = int((time.time() if at is None else at) * 1000)
    return f"{ms:012x}{uuid.uuid4().hex[:20]}"


def batch_cost(price: Price | None, usage: Usage) -> Decimal | None:
    """A batch request's cost at the batch rates (half the synchronous ones by default)."""
    return None if price is None else price.batch_cost(usage)


async def _requests(
    rt: EvalRuntime, spec: EvalSpec, batch: str, keys: list[str], chunk: str, pipeline: bool
) -> list[Request]:
    if pipeline:  # a pipeline stage's chunk: its pieces' inputs
        rows = await pipebatch.requests_of(rt, chunk, keys)
    else:
        rows = await rt.store.execute("chunk_requests", {"b": batch, "spec": spec.hash,
                                                         "keys": keys})  # fmt: skip
    if not rows:
        # A submission stores a chunk's items just after enqueuing its job, so a worker
        # can run the job in between: retried, the items are there. A purged batch's
        # never come, and the job dead-letters once its attempts are spent.
        raise Retry(f"batch {batch!r}: none of the chunk's documents is stored", after=RACE_RETRY)
    return [
        Request(custom_id=key, system=spec.system, user=text,
                schema=spec.schema, params=spec.params)
        for key, text in rows
    ]  # fmt: skip


async def _cancelled(rt: EvalRuntime, batch: str) -> bool:
    rows = await rt.store.execute("parked_state", {"b": batch})
    return bool(rows) and rows[0][0] == "cancelled"


async def _drop_chunk(
    ctx: JobContext, rt: EvalRuntime, handle: str, payload: dict[str, Any]
) -> dict[str, Any]:
    """The batch was cancelled before this chunk's provider batch was created."""
    async with fenced(ctx, rt.store) as conn:
        await EvalStore.on(conn, "drop_chunk", handle=handle)
        if payload.get("pipeline"):
            await pipebatch.dropped(conn, payload["chunk"])
    return {"handle": handle, "cancelled": True}


async def batch_submit(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The built-in batch-submit task (registered in herd.builtin)."""
    rt = await EvalRuntime.of(ctx.app)
    batch, spec_hash, chunk, keys = (payload[k] for k in ("batch", "spec", "chunk", "keys"))
    spec = await rt.store.spec(spec_hash)
    # The handle first, fenced, with the key it is made with: whoever runs this job later
    # finds the same one, and reaches the provider batch with the same key.
    pool = rt.pool_variables(spec)
    async with fenced(ctx, rt.store) as conn:
        if pool:
            await conn.execute(ledger.Q["pick_batch_key"])
        inserted = await conn.execute(
            ledger.Q["record_handle"],
            {"random": uuid.uuid4().hex[:20], "chunk": chunk, "b": batch, "spec": spec_hash,
             "provider": spec.provider, "pool": pool},
        )  # fmt: skip
        fresh = inserted.rowcount == 1
        (row,) = await EvalStore.on(conn, "handle_of_chunk", chunk=chunk)
    handle, file_id, batch_id, variable = row
    api = rt.batch_api(spec, variable)
    if batch_id is None:
        # What a predecessor made before it died is at the provider, under the handle;
        # a handle this run made has nothing there yet.
        found = Found() if fresh else await api.find(handle)
        file_id, batch_id = file_id or found.file_id, found.batch_id
        if batch_id is None:
            if await _cancelled(rt, batch):
                return await _drop_chunk(ctx, rt, handle, payload)
            if file_id is None:
                requests = await _requests(
                    rt, spec, batch, keys, chunk, bool(payload.get("pipeline"))
                )
                await ctx.check_lease()
                file_id = await api.upload(handle, requests)
            await ctx.check_lease()
            if await _cancelled(rt, batch):  # the file costs nothing; only a batch is billed
                return await _drop_chunk(ctx, rt, handle, payload)
            batch_id = await api.create(handle, file_id)
        async with fenced(ctx, rt.store) as conn:
            await EvalStore.on(conn, "polling", file=file_id, batch_id=batch_id, handle=handle)
    poll = await ctx.app.enqueue(
        POLL_TASK,
        {
            "handle": handle,
            "keys": keys,
            "submit": ctx.job_id,
            **({"retry": True} if payload.get("retry") else {}),
            **(
                {"pipeline": payload["pipeline"], "chunk": chunk} if payload.get("pipeline") else {}
            ),
        },  # fmt: skip
        queue=QUEUE,
        dedup_key=f"batchapi-poll:{handle}",
        delay=POLL_FIRST,
    )
    # The items wait on the poll job now (herd eval status settles them from it), those
    # of later submissions that joined this chunk's keys included.
    async with fenced(ctx, rt.store) as conn:
        await EvalStore.on(conn, "move_items", to=poll.job_id, job=ctx.job_id)
        if payload.get("pipeline"):
            await pipebatch.moved(conn, chunk, poll.job_id)
    return {"handle": handle, "provider_batch": batch_id, "poll_job": poll.job_id,
            "requests": len(keys)}  # fmt: skip


async def batch_poll(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The built-in batch-poll task (registered in herd.builtin)."""
    rt = await EvalRuntime.of(ctx.app)
    handle, keys = payload["handle"], payload["keys"]
    rows = await rt.store.execute("provider_batch", {"handle": handle})
    if not rows:
        raise Fatal(f"provider batch handle {handle} is not recorded (purged?)")
    batch, spec_hash, batch_id, state, polls, variable = rows[0]
    pipeline = payload.get("pipeline")
    if state == "done":
        if pipeline:  # settled, then killed before the next stage was gathered
            await pipebatch.after_settle(ctx.app, rt, pipeline, batch)
        return {"handle": handle, "provider_batch": batch_id, "state": state}
    spec = await rt.store.spec(spec_hash)
    api = rt.batch_api(spec, variable)
    cancelled = await _cancelled(rt, batch)
    # Asked again on every poll of a cancelled batch: cancelling is idempotent, and the
    # batch may have been created after `herd eval cancel` looked.
    found = await (api.cancel(batch_id) if cancelled else api.retrieve(batch_id))
    if not found.ended:
        await rt.store.execute("polled", {"status": found.status, "handle": handle})
        after = POLL_FIRST if cancelled else min(POLL_MAX, POLL_FIRST * 2 ** min(polls, 10))
        raise Snooze(f"provider batch {batch_id} is {found.status}", after=after)
    matched = await _match(api, found, handle, keys, spec)
    good, failed, billed = matched.good, matched.failed, matched.billed
    price = rt.prices.lookup(spec.model, spec.provider)
    for key, value in good.items():
        await rt.cache.put(key, value)
    # Retried once; enqueued before the fan-out commits, so a takeover enqueues them
    # again at worst, deduplicated onto the same jobs. A cancelled batch retries nothing.
    serving = [ctx.job_id] + ([int(payload["submit"])] if payload.get("submit") else [])
    if failed and cancelled and not pipeline:  # retried only for the items still waiting
        waiting = await rt.store.execute(
            "still_waiting_keys", {"jobs": serving, "keys": list(failed)}
        )
        failed = {k: failed[k] for (k,) in waiting}
    fallback: dict[str, int] = {}
    if failed and not pipeline:  # a pipeline's pieces are retried by pipebatch.settle
        fallback = await _retry(ctx, batch, spec_hash, handle, failed, bool(payload.get("retry")))
    async with fenced(ctx, rt.store) as conn:
        for key, usage, kind in billed:
            # A billed line whose usage cannot be read gets its row all the same, its
            # tokens and cost unknown (NULL), so the ledger never omits a paid request.
            await ledger.record(conn, {
                "batch": batch, "job": ctx.job_id, "key": key, "kind": kind,
                "model": spec.model, "provider": spec.provider,
                "i": usage.input_tokens if usage else 0, "o": usage.output_tokens if usage else 0,
                "cost": batch_cost(price, usage) if usage else None,
                "ci": usage.cached_input_tokens if usage else 0,
                "cw": usage.cache_write_tokens if usage else 0,
                "ps": None if price is None or not usage else price.batch_cache_saved(usage),
                "kid": api.key_id,
            })  # fmt: skip
        for key, value in good.items():
            result = {"key": key, "source": "batch", **value}
            await EvalStore.on(conn, "key_done_by_batch", result=Jsonb(result), jobs=serving,
                               key=key)  # fmt: skip
        for key, job_id in fallback.items():
            await EvalStore.on(conn, "move_key", to=job_id, jobs=serving, key=key)
        if pipeline:
            await pipebatch.settle(conn, rt, pipeline, batch, payload["chunk"], good, failed,
                                   cancelled)  # fmt: skip
        await EvalStore.on(conn, "provider_batch_done", status=found.status, handle=handle)
    if pipeline:
        await pipebatch.after_settle(ctx.app, rt, pipeline, batch)
    telemetry.model_batch(spec.provider, spec.model, [u for _, u, _ in billed if u], price=price)
    return {"handle": handle, "provider_batch": batch_id, "status": found.status,
            "answered": len(good), "fallback": len(fallback), "unknown_ids": matched.unknown,
            "duplicate_ids": matched.duplicate, "bad_lines": matched.malformed}  # fmt: skip


@dataclass
class _Matched:
    good: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> cached value
    failed: dict[str, str] = field(default_factory=dict)  # key -> why
    billed: list[tuple[str, Usage | None, str]] = field(default_factory=list)  # key, usage, kind
    unknown: int = 0  # lines whose custom_id names no request of the chunk
    duplicate: int = 0  # lines for a request answered by an earlier line
    malformed: int = 0  # lines that do not follow the wire format


async def _match(
    api: BatchAPI, found: ProviderBatch, handle: str, keys: list[str], spec: EvalSpec
) -> _Matched:
    """The provider batch's result lines, read one at a time, matched to the chunk's keys.

    A line answers the key whose custom_id it carries exactly (the ids are a table of
    the chunk's own: an empty, cut or foreign id answers nothing, so it can never hand
    one document's answer to another, nor into the exact cache). Unknown ids and any
    line after the first for a key are counted, logged and dropped: a key is applied,
    and ledgered, once; an unknown line the provider billed is ledgered as 'failed'. A
    malformed line is counted and logged; the key it names, if any, fails (and is
    retried), and the others are filed as usual, so one bad line never loses a billed
    batch."""
    ids = {**api.legacy_ids(handle, keys), **{api.custom_id(handle, key): key for key in keys}}
    out = _Matched()
    seen: set[str] = set()
    async for r in api.results(found):
        if r.malformed:
            out.malformed += 1
            log.warning("provider batch %s: a malformed result line (custom_id %r): %s",
                        found.id, _short(r.custom_id), r.error)  # fmt: skip
        key = None if r.custom_id is None else ids.get(r.custom_id)
        if key is None:
            if r.billed:  # paid, though it answers none of ours: a 'failed' row of its own
                out.billed.append((f"unknown-id:{_short(r.custom_id)}", r.usage, "failed"))
            if r.custom_id is not None:
                out.unknown += 1
                log.warning("provider batch %s: dropped a result line whose custom_id %r"
                            " names no request of handle %s", found.id, _short(r.custom_id),
                            handle)  # fmt: skip
            continue
        if key in seen:
            out.duplicate += 1
            log.warning("provider batch %s: dropped a second result line for custom_id %r",
                        found.id, _short(r.custom_id))  # fmt: skip
            continue
        seen.add(key)
        if r.billed:
            out.billed.append((key, r.usage, "call" if r.usage else "failed"))
        if r.error is not None or r.text is None:
            out.failed[key] = r.error or "no answer"
            continue
        value, error = validate_answer(r.text, spec.schema)
        if error is not None:
            out.failed[key] = error
        else:
            out.good[key] = {"output": value, "model": r.model or spec.model}
    for key in keys:
        if key not in seen:
            out.failed[key] = f"the provider batch ended {found.status} without answering it"
    return out


def _short(custom_id: str | None) -> str | None:
    return None if custom_id is None else custom_id[:100]  # a provider's id, bounded in logs


async def _retry(
    ctx: JobContext,
    batch: str,
    spec_hash: str,
    handle: str,
    failed: dict[str, str],
    second: bool,
) -> dict[str, int]:
    """The one retry of the requests a provider batch failed: a herd.eval job each, or
    one new provider batch (HERD_EVAL_BATCH_RETRY=batch). After a retry batch fails a
    request too, its herd.eval job dead-letters it with the provider's error (a
    ``herd dlq retry`` of that job then tries once more through the synchronous path).
    Returns the job now serving each key."""
    rt = await EvalRuntime.of(ctx.app)
    if ctx.app.settings.eval_batch_retry == "batch" and not second:
        keys = sorted(failed)
        chunk = hashlib.sha256(f"{handle}:retry".encode()).hexdigest()
        result = await ctx.app.enqueue(
            SUBMIT_TASK,
            {"batch": batch, "spec": spec_hash, "chunk": chunk, "keys": keys, "retry": True},
            queue=QUEUE,
            dedup_key=f"batchapi:{chunk}",
        )
        return dict.fromkeys(keys, result.job_id)
    docs = await rt.store.execute(
        "retry_documents", {"b": batch, "spec": spec_hash, "keys": list(failed)}
    )
    last = ctx.app.settings.eval_batch_retry == "batch"
    enqueued = await ctx.app.enqueue_many(
        TASK,
        [
            {
                "batch": batch,
                "path": p,
                "doc": d,
                "spec": spec_hash,
                "key": k,
                "batch_error": failed[k],
                **({"batch_failed": True} if last else {}),
            }
            for k, p, d in docs
        ],  # fmt: skip
        queue=QUEUE,
        dedup_keys=[k for k, _, _ in docs],
        **in_turns(batch, len(docs)),
    )
    return {k: r.job_id for (k, _, _), r in zip(docs, enqueued, strict=True)}


async def settle_late(app: App, job: Job) -> None:
    """Items that joined a chunk's keys just as its job finished: after a submit job
    they wait on its poll job; after a poll job their answers are in the exact cache
    (or, for a key the provider batch failed, a synchronous job answers it now)."""
    rt = await EvalRuntime.of(app)
    poll = job.result.get("poll_job") if isinstance(job.result, dict) else None
    if job.task == SUBMIT_TASK and isinstance(poll, int):
        await rt.store.execute("move_items", {"to": poll, "job": job.id})
        return
    rows = await rt.store.execute("late_items", {"job": job.id})
    for key, batch, path, doc, spec_hash in rows:
        value = await rt.cache.get(key)
        if isinstance(value, dict):
            await rt.store.execute(
                "job_key_done_by_batch",
                {"result": Jsonb({"key": key, "source": "batch", **value}), "job": job.id,
                 "key": key},
            )  # fmt: skip
            continue
        made = await app.enqueue(
            TASK,
            {"batch": batch, "path": path, "doc": doc, "spec": spec_hash, "key": key},
            queue=QUEUE,
            dedup_key=key,
            concurrency_key=turns(batch),
            max_running_per_key=TURNS,
        )
        await rt.store.execute("move_job_key", {"to": made.job_id, "job": job.id, "key": key})
