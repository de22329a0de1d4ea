"""Evaluations through a provider's Batch API: half the price, answers within 24 hours.

``submit(..., batch_api=True)`` stores documents and items as the synchronous path
does; the keys the exact cache cannot answer, deduplicated, go into one
``herd.eval.batch_submit`` job per chunk of a (batch, spec) instead of a job per key.

Exactly once through crashes. A provider batch submitted twice is billed twice, and
a worker can die between "created the batch" and "recorded that I did". So the
submit job first records, fenced by its lease, a handle for its chunk (a row of
herd_eval_provider_batches); the handle names the uploaded file and is the provider
batch's metadata (Anthropic's batches have neither: every custom_id carries it).
Whoever runs the job after a takeover looks the handle up at the provider before
making anything, reuses the file and batch found, and uploads or creates only what
is missing; a run that has just recorded the handle knows nothing is there yet. A
SIGKILL at any step therefore never makes a second provider batch
(tests/llm/test_batch_api.py kills at each).

Polling is a job, not a blocked worker: ``herd.eval.batch_poll`` checks the provider
batch and hands itself back (Snooze, no attempt counted), backing off from
POLL_FIRST to POLL_MAX seconds. Once it has ended, the answers go to the exact
cache, the items and the ledger (at the batch price) in one fenced transaction.
Requests that errored, expired or answered outside the schema are retried once, as
HERD_EVAL_BATCH_RETRY says: through the synchronous path (a herd.eval job, which
repairs and dead-letters as usual; the default) or in a new provider batch, whose own
failures are dead-lettered with the provider's error.

``herd eval cancel`` (herd.llm.cancel) cancels the provider batches too: a submit job
that finds its batch cancelled before it created anything creates nothing, and a poll
job asks the provider to cancel (again: it may have been created after the command
looked), then files what the provider answered before it stopped, which is billed.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from dataclasses import asdict
from typing import Any

from psycopg.types.json import Jsonb

from herd import telemetry
from herd.app import App
from herd.errors import Fatal, InvalidInput, Retry, Snooze
from herd.jsonvalue import canonical, check, check_text
from herd.llm import evaluate, ledger
from herd.llm.completion import Usage
from herd.llm.evaluate import EvalRuntime, EvalSpec, fenced, validate_answer
from herd.llm.pricing import Price
from herd.llm.providers.anthropic_batch import AnthropicBatch
from herd.llm.providers.batch import BatchAPI, Found, Request
from herd.llm.providers.openai_batch import OpenAIBatch
from herd.queue.base import EnqueueResult, Job
from herd.tasks import JobContext

SUBMIT_TASK = "herd.eval.batch_submit"
POLL_TASK = "herd.eval.batch_poll"
QUEUE = evaluate.QUEUE
PROVIDERS = ("openai", "anthropic")
POLL_FIRST = 2.0
POLL_MAX = 60.0
RACE_RETRY = 2.0  # seconds before a submit job that ran before its items were stored runs again
# A chunk's keys travel in its jobs' payloads: a key and its JSON quoting, with room
# for the rest of the payload, so a chunk fits HERD_MAX_PAYLOAD_BYTES.
KEY_BYTES = 70
PAYLOAD_SPARE = 4096

# Fault injection for the kill-at-each-step test only: with HERD_TEST_CRASH_AT naming
# a step (after_record_handle, after_upload, after_create), the process dies there as
# SIGKILL would kill it. Read once, at import.
CRASH_POINTS = ("after_record_handle", "after_upload", "after_create")
_CRASH_AT = os.environ.get("HERD_TEST_CRASH_AT") or None


def _fault_point(step: str) -> None:
    if step == _CRASH_AT:
        os._exit(137)


def new_handle() -> str:
    """A chunk's handle: its creation time in milliseconds (12 hex), then 20 random hex.

    The time lets a provider whose batches carry no metadata (Anthropic) stop looking
    for the handle's batch among those made before it."""
    return f"{time.time_ns() // 1_000_000:012x}{uuid.uuid4().hex[:20]}"


def chunk_size(app: App, api_max: int = OpenAIBatch.max_requests) -> int:
    """Requests per provider batch: the provider's limit, or what a payload can carry."""
    return max(1, min(api_max, (app.settings.max_payload_bytes - PAYLOAD_SPARE) // KEY_BYTES))


def check_provider(spec: EvalSpec) -> None:
    if spec.provider not in PROVIDERS:
        raise InvalidInput(
            f"batch_api: the {spec.provider} Batch API is not supported yet"
            f" (supported: {', '.join(PROVIDERS)}); submit without it",
            field="batch_api",
        )


def check_unlimited(budget: float | None, limits: dict[str, Any] | None) -> None:
    """The batch path reserves nothing against a budget and the provider paces its own
    batch: refused rather than silently not kept."""
    if budget is not None or limits:
        raise InvalidInput(
            "batch_api: a budget or rpm/tpm/max_concurrent limits are not kept through the"
            " Batch API yet; submit without one or the other",
            field="batch_api",
        )


def batch_api(app: App, spec: EvalSpec) -> BatchAPI:
    """The spec's Batch API client, one per process and (provider, model)."""
    clients: dict[tuple[str, str], BatchAPI] | None = app.state.get("eval.batchapi")
    if clients is None:
        clients = app.state["eval.batchapi"] = {}

        async def close() -> None:
            for client in clients.values():
                await client.aclose()
            clients.clear()

        app.on_close(close)
    found = clients.get((spec.provider, spec.model))
    if found is None:
        kind = {"openai": OpenAIBatch, "anthropic": AnthropicBatch}.get(spec.provider)
        if kind is None:
            raise Fatal(f"the {spec.provider} Batch API is not supported yet")
        found = clients[(spec.provider, spec.model)] = kind(model=spec.model)
    return found


def batch_cost(price: Price | None, usage: Usage) -> float | None:
    """A batch request's cost at the batch rates (half the synchronous ones by default)."""
    return None if price is None else price.batch_cost(usage)


async def enqueue_batch_documents(
    app: App,
    spec: EvalSpec,
    batch: str,
    items: list[tuple[str, str]],
    *,
    priority: int = 0,
) -> list[EnqueueResult]:
    """Like ``evaluate.enqueue_documents``, but the keys the exact cache does not hold
    go into one batch-submit job per chunk; the cached ones take the synchronous path
    (their jobs find the answer in the cache and record it). One result per item."""
    spec.check(app.settings)
    check_provider(spec)
    check_text(batch, "batch")
    check(asdict(spec), what="spec")
    for i, (name, text) in enumerate(items):
        check_text(name, f"documents[{i}].name")
        check_text(text, f"documents[{i}].text")
    if not items:
        return []
    rt = await EvalRuntime.of(app)
    rows = [
        (name, hashlib.sha256(text.encode()).hexdigest(), spec.key(text)) for name, text in items
    ]
    cached = {k for k in {k for _, _, k in rows} if await rt.cache.get(k) is not None}
    out: dict[int, EnqueueResult] = {}
    sync = [i for i, (_, _, k) in enumerate(rows) if k in cached]
    if sync:
        done = await evaluate.enqueue_documents(
            app, spec, batch, [items[i] for i in sync], priority=priority
        )
        out.update(zip(sync, done, strict=True))
    rest = [i for i in range(len(rows)) if i not in out]
    if rest:
        await rt.store.put_batch(batch, budget=None, limits=None)
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
        await rt.store.execute(
            "INSERT INTO herd_eval_items (batch, path, key, job_id, doc, spec) SELECT %s, p, k,"
            " j, d, %s FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::text[])"
            " AS x(p, k, j, d) ON CONFLICT DO NOTHING",
            (
                batch,
                spec.hash,
                [rows[i][0] for i in rest],
                [rows[i][2] for i in rest],
                [job_of[rows[i][2]].job_id for i in rest],
                [rows[i][1] for i in rest],
            ),
        )
        seen: set[str] = set()
        for i in rest:
            key = rows[i][2]
            r = job_of[key]
            # A key's first document makes the request; the others share its answer.
            out[i] = EnqueueResult(r.job_id, r.created and key not in seen)
            seen.add(key)
    return [out[i] for i in range(len(rows))]


async def in_flight(app: App, spec: EvalSpec, keys: list[str]) -> list[tuple[str, int]]:
    """(key, job) for each of ``keys`` that a pending or running job already serves."""
    if not keys:
        return []
    rt = await EvalRuntime.of(app)
    rows = await rt.store.execute(
        "SELECT DISTINCT ON (key) key, job_id FROM herd_eval_items"
        " WHERE spec = %s AND key = ANY(%s) AND status <> 'done' AND status IN ('queued', 'parked')"
        " ORDER BY key, job_id DESC",
        (spec.hash, keys),
    )
    if not rows:
        return []
    jobs = {j.id: j for j in await evaluate.jobs_of(app, sorted({job for _, job in rows}))}
    return [(k, job) for k, job in rows if job in jobs and jobs[job].status.active]


async def _requests(rt: EvalRuntime, spec: EvalSpec, batch: str, keys: list[str]) -> list[Request]:
    rows = await rt.store.execute(
        "SELECT DISTINCT ON (i.key) i.key, d.text FROM herd_eval_items i"
        " JOIN herd_eval_documents d ON d.hash = i.doc"
        " WHERE i.batch = %s AND i.spec = %s AND i.key = ANY(%s)",
        (batch, spec.hash, keys),
    )
    if not rows:
        # enqueue_batch_documents stores a chunk's items just after enqueuing its job, so
        # a worker can run the job in between: retried, the items are there. A purged
        # batch's never come, and the job dead-letters once its attempts are spent.
        raise Retry(f"batch {batch!r}: none of the chunk's documents is stored", after=RACE_RETRY)
    return [
        Request(custom_id=key, system=spec.system, user=text,
                schema=spec.schema, params=spec.params)
        for key, text in rows
    ]  # fmt: skip


async def _cancelled(conn: Any, batch: str) -> bool:
    cur = await conn.execute("SELECT parked FROM herd_eval_batches WHERE batch = %s", (batch,))
    row = await cur.fetchone()
    return row is not None and row[0] == "cancelled"


async def _drop_chunk(ctx: JobContext, rt: EvalRuntime, handle: str) -> dict[str, Any]:
    """The batch was cancelled before this chunk's provider batch was created."""
    async with fenced(ctx, rt.store) as conn:
        await conn.execute(
            "UPDATE herd_eval_provider_batches SET state = 'done', status = 'cancelled',"
            " updated_at = now() WHERE handle = %s",
            (handle,),
        )
    return {"handle": handle, "cancelled": True}


async def batch_submit(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The built-in batch-submit task (registered in herd.builtin)."""
    rt = await EvalRuntime.of(ctx.app)
    batch, spec_hash, chunk, keys = (payload[k] for k in ("batch", "spec", "chunk", "keys"))
    spec = await rt.store.spec(spec_hash)
    api = batch_api(ctx.app, spec)
    table = "herd_eval_provider_batches"
    # The handle first, fenced: whoever runs this job later finds the same one.
    async with fenced(ctx, rt.store) as conn:
        inserted = await conn.execute(
            f"INSERT INTO {table} (handle, chunk, batch, spec, provider)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (chunk) DO NOTHING",
            (new_handle(), chunk, batch, spec_hash, api.name),
        )
        fresh = inserted.rowcount == 1
        cur = await conn.execute(
            f"SELECT handle, file_id, provider_batch_id FROM {table} WHERE chunk = %s", (chunk,)
        )
        row = await cur.fetchone()
        cancelled = await _cancelled(conn, batch)
    assert row is not None
    handle, file_id, batch_id = row
    _fault_point("after_record_handle")
    if batch_id is None:
        # What a predecessor made before it died is at the provider, under the handle;
        # a handle this run made has nothing there yet.
        found = Found() if fresh else await api.find(handle)
        file_id, batch_id = file_id or found.file_id, found.batch_id
        if batch_id is None:
            if cancelled:
                return await _drop_chunk(ctx, rt, handle)
            if file_id is None:
                requests = await _requests(rt, spec, batch, keys)
                await ctx.check_lease()
                file_id = await api.upload(handle, requests)
                _fault_point("after_upload")
            await ctx.check_lease()
            async with rt.store.transaction() as conn:
                cancelled = await _cancelled(conn, batch)
            if cancelled:  # the file costs nothing; only a batch is billed
                return await _drop_chunk(ctx, rt, handle)
            batch_id = await api.create(handle, file_id)
            _fault_point("after_create")
        async with fenced(ctx, rt.store) as conn:
            await conn.execute(
                f"UPDATE {table} SET file_id = %s, provider_batch_id = %s, state = 'polling',"
                " updated_at = now() WHERE handle = %s",
                (file_id, batch_id, handle),
            )
    poll = await ctx.app.enqueue(
        POLL_TASK,
        {
            "handle": handle,
            "keys": keys,
            "submit": ctx.job_id,
            **({"retry": True} if payload.get("retry") else {}),
        },  # fmt: skip
        queue=QUEUE,
        dedup_key=f"batchapi-poll:{handle}",
        delay=POLL_FIRST,
    )
    # The items wait on the poll job now (herd eval status settles them from it), those
    # of later submissions that joined this chunk's keys included.
    async with fenced(ctx, rt.store) as conn:
        await conn.execute(
            "UPDATE herd_eval_items SET job_id = %s WHERE job_id = %s AND status = 'queued'",
            (poll.job_id, ctx.job_id),
        )
    return {"handle": handle, "provider_batch": batch_id, "poll_job": poll.job_id,
            "requests": len(keys)}  # fmt: skip


async def batch_poll(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The built-in batch-poll task (registered in herd.builtin)."""
    rt = await EvalRuntime.of(ctx.app)
    handle, keys = payload["handle"], payload["keys"]
    rows = await rt.store.execute(
        "SELECT batch, spec, provider_batch_id, state, polls FROM herd_eval_provider_batches"
        " WHERE handle = %s",
        (handle,),
    )
    if not rows:
        raise Fatal(f"provider batch handle {handle} is not recorded (purged?)")
    batch, spec_hash, batch_id, state, polls = rows[0]
    if state == "done":
        return {"handle": handle, "provider_batch": batch_id, "state": state}
    spec = await rt.store.spec(spec_hash)
    api = batch_api(ctx.app, spec)
    async with rt.store.transaction() as conn:
        cancelled = await _cancelled(conn, batch)
    # Asked again on every poll of a cancelled batch: cancelling is idempotent, and the
    # batch may have been created after `herd eval cancel` looked.
    found = await (api.cancel(batch_id) if cancelled else api.retrieve(batch_id))
    if not found.ended:
        await rt.store.execute(
            "UPDATE herd_eval_provider_batches SET polls = polls + 1, status = %s,"
            " updated_at = now() WHERE handle = %s",
            (found.status, handle),
        )
        after = POLL_FIRST if cancelled else min(POLL_MAX, POLL_FIRST * 2 ** min(polls, 10))
        raise Snooze(f"provider batch {batch_id} is {found.status}", after=after)
    answered = {r.custom_id: r for r in await api.results(found)}
    # A provider whose custom_id cannot hold a whole key answers under a key prefix.
    widths = sorted({len(c) for c in answered}, reverse=True)
    price = rt.prices.lookup(spec.model, spec.provider)
    good: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    billed = []
    for key in keys:
        r = next((answered[key[:n]] for n in widths if key[:n] in answered), None)
        if r is None:
            failed[key] = f"the provider batch ended {found.status} without answering it"
            continue
        if r.usage is not None:
            billed.append((key, r.usage))
        if r.error is not None or r.text is None:
            failed[key] = r.error or "no answer"
            continue
        value, error = validate_answer(r.text, spec.schema)
        if error is not None:
            failed[key] = error
        else:
            good[key] = {"output": value, "model": r.model or spec.model}
    for key, value in good.items():
        await rt.cache.put(key, value)
    # Retried once; enqueued before the fan-out commits, so a takeover enqueues them
    # again at worst, deduplicated onto the same jobs. A cancelled batch retries nothing.
    serving = [ctx.job_id] + ([int(payload["submit"])] if payload.get("submit") else [])
    if failed and cancelled:  # retried only for the items still waiting (other batches')
        waiting = await rt.store.execute(
            "SELECT DISTINCT key FROM herd_eval_items WHERE job_id = ANY(%s) AND key = ANY(%s)"
            " AND status IN ('queued', 'parked')",
            (serving, list(failed)),
        )
        failed = {k: failed[k] for (k,) in waiting}
    fallback: dict[str, int] = {}
    if failed:
        fallback = await _retry(ctx, batch, spec_hash, handle, failed, bool(payload.get("retry")))
    async with fenced(ctx, rt.store) as conn:
        for key, usage in billed:
            await ledger.record(conn, {
                "batch": batch, "job": ctx.job_id, "key": key, "kind": "call",
                "model": spec.model, "provider": spec.provider, "i": usage.input_tokens,
                "o": usage.output_tokens, "cost": batch_cost(price, usage),
                "ci": usage.cached_input_tokens, "cw": usage.cache_write_tokens,
                "ps": None if price is None else price.batch_cache_saved(usage),
            })  # fmt: skip
        for key, value in good.items():
            result = {"key": key, "source": "batch", **value}
            # By job, not batch: a later submission's items joined these keys. An answer
            # that came back from a batch cancelled mid-run was paid for: delivered.
            await conn.execute(
                "UPDATE herd_eval_items SET status = 'done', source = 'batch',"
                " result = %s || jsonb_build_object('path', path), finished_at = now()"
                " WHERE job_id = ANY(%s) AND key = %s AND status <> 'done'",
                (Jsonb(result), serving, key),
            )
        for key, job_id in fallback.items():
            await conn.execute(
                "UPDATE herd_eval_items SET job_id = %s WHERE job_id = ANY(%s) AND key = %s"
                " AND status IN ('queued', 'parked')",
                (job_id, serving, key),
            )
        await conn.execute(
            "UPDATE herd_eval_provider_batches SET state = 'done', status = %s,"
            " updated_at = now() WHERE handle = %s",
            (found.status, handle),
        )
    telemetry.model_batch(spec.provider, spec.model, [u for _, u in billed], price=price)
    return {"handle": handle, "provider_batch": batch_id, "status": found.status,
            "answered": len(good), "fallback": len(fallback)}  # fmt: skip


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
        "SELECT DISTINCT ON (key) key, path, doc FROM herd_eval_items"
        " WHERE batch = %s AND spec = %s AND key = ANY(%s)",
        (batch, spec_hash, list(failed)),
    )
    last = ctx.app.settings.eval_batch_retry == "batch"
    enqueued = await ctx.app.enqueue_many(
        evaluate.TASK,
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
    )
    return {k: r.job_id for (k, _, _), r in zip(docs, enqueued, strict=True)}


async def settle_late(app: App, job: Job) -> None:
    """Items that joined a chunk's keys just as its job finished: after a submit job
    they wait on its poll job; after a poll job their answers are in the exact cache
    (or, for a key the provider batch failed, a synchronous job answers it now)."""
    rt = await EvalRuntime.of(app)
    job_id = job.id
    poll = job.result.get("poll_job") if isinstance(job.result, dict) else None
    if job.task == SUBMIT_TASK and isinstance(poll, int):
        await rt.store.execute(
            "UPDATE herd_eval_items SET job_id = %s WHERE job_id = %s AND status = 'queued'",
            (poll, job_id),
        )
        return
    rows = await rt.store.execute(
        "SELECT DISTINCT ON (key) key, batch, path, doc, spec FROM herd_eval_items"
        " WHERE job_id = %s AND status <> 'done' AND status IN ('queued', 'parked')",
        (job_id,),
    )
    for key, batch, path, doc, spec_hash in rows:
        value = await rt.cache.get(key)
        if isinstance(value, dict):
            await rt.store.execute(
                "UPDATE herd_eval_items SET status = 'done', source = 'batch',"
                " result = %s || jsonb_build_object('path', path), finished_at = now()"
                " WHERE job_id = %s AND key = %s AND status <> 'done'",
                (Jsonb({"key": key, "source": "batch", **value}), job_id, key),
            )
            continue
        made = await app.enqueue(
            evaluate.TASK,
            {"batch": batch, "path": path, "doc": doc, "spec": spec_hash, "key": key},
            queue=QUEUE,
            dedup_key=key,
        )
        await rt.store.execute(
            "UPDATE herd_eval_items SET job_id = %s WHERE job_id = %s AND key = %s"
            " AND status <> 'done' AND status IN ('queued', 'parked')",
            (made.job_id, job_id, key),
        )
