"""A pipeline's stage through the provider's Batch API: maps batched, then reduces
batched (``batch_api = true`` on a stage, or ``--batch-api`` for every model stage).

A batched stage's pieces are decided as any stage's are (stored, keyed, counted in
their fan-in, herd.llm.eval.stages) but are not one job each: a gathering job takes
every such piece of the batch not yet gathered, answers the exact cache's keys by a job
each (nothing sent to the provider: the job finds the answer), and writes the others,
deduplicated by key, into chunks, one provider batch each (herd.llm.eval.batchapi
submits and polls it, its crash safety included). The chunk is written on the pieces
before its submit job is enqueued: a run again after a crash re-sends that chunk, whose
handle finds the provider batch already made, rather than gathering the pieces anew.

The chunk's poll job settles it in its fenced transaction: each answered key ends
every piece of the chunk that asked it and runs that piece's fan-in step there, as a
piece's own job would (so a reduce is decided after the last map, exactly once); the
ledger rows are the poll's, at the batch price. Keys the provider batch failed are
retried once by a job each (the synchronous path, which repairs and dead-letters); a
cancelled batch's are cancelled. After the commit the poll gathers again: the next
stage's pieces of every document the provider batch completed share one provider batch.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from herd.app import App
from herd.context import JobContext
from herd.llm.eval.pipeline import Pipeline
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.spec import QUEUE, SUBMIT_TASK
from herd.llm.eval.stages import SYNC, Q, advance, load_pipeline, on, send_unsent
from herd.llm.eval.submit import chunk_size


async def _cancelled(rt: EvalRuntime, batch: str) -> bool:
    rows = await rt.store.execute("parked_state", {"b": batch})
    return bool(rows) and rows[0][0] == "cancelled"


async def gather(app: App, rt: EvalRuntime, pipe: Pipeline, batch: str, priority: int = 0) -> int:
    """Gather the batch's pieces of its batched stages into chunks and send each chunk
    to a submit job, then the pieces answered by a job of their own; returns the
    provider batches (chunks) sent. Idempotent: what is gathered or sent is skipped."""
    stages = pipe.batched
    if not stages:
        return 0
    if await _cancelled(rt, batch):
        # Nothing more is gathered; pieces of a job of their own end in it, cancelled.
        await rt.store.execute(Q["cancel_ungathered"], {"b": batch, "stages": stages})
        await send_unsent(app, rt, pipe, batch, None, priority)
        return 0
    rows = await rt.store.execute(Q["gather_keys"], {"b": batch, "stages": stages})
    by_spec: dict[str, list[str]] = defaultdict(list)
    hits: dict[str, list[str]] = defaultdict(list)
    for key, spec in rows:
        # Answered already: no request is made for it (its job reads the cache).
        (hits if await rt.cache.get(key) is not None else by_spec)[spec].append(key)
    where = {"b": batch, "stages": stages}
    for spec, keys in hits.items():
        await rt.store.execute(Q["gather"], {**where, "chunk": SYNC, "keys": keys, "spec": spec})
    size = chunk_size(app)
    for spec, keys in by_spec.items():
        keys.sort()
        for start in range(0, len(keys), size):
            await rt.store.execute(Q["gather"], {**where, "chunk": uuid.uuid4().hex,
                                                 "keys": keys[start : start + size],
                                                 "spec": spec})  # fmt: skip
    # Every chunk gathered and not sent: this run's, and one a crash left unsent.
    chunks = await rt.store.execute(Q["unsent_chunks"], {"b": batch})
    for chunk, spec, keys in chunks:
        made = await app.enqueue(
            SUBMIT_TASK,
            {"batch": batch, "spec": spec, "chunk": chunk, "keys": list(keys),
             "pipeline": pipe.hash},
            queue=QUEUE,
            priority=priority,
            dedup_key=f"batchapi:{chunk}",
        )  # fmt: skip
        await rt.store.execute(Q["chunk_sent"], {"job": made.job_id, "chunk": chunk})
    await send_unsent(app, rt, pipe, batch, None, priority)
    return len(chunks)


async def gather_task(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The built-in gathering task (registered in herd.builtin)."""
    rt = await EvalRuntime.of(ctx.app)
    pipe = await load_pipeline(rt, payload["pipeline"])
    sent = await gather(ctx.app, rt, pipe, payload["batch"], int(payload.get("priority", 0)))
    return {"batch": payload["batch"], "provider_batches": sent}


async def requests_of(rt: EvalRuntime, chunk: str, keys: list[str]) -> list[tuple[str, str]]:
    """(key, input text) of a chunk's requests."""
    rows = await rt.store.execute(Q["chunk_piece_requests"], {"chunk": chunk, "keys": keys})
    return [(k, t) for k, t in rows]


async def moved(conn: AsyncConnection[Any], chunk: str, job_id: int) -> None:
    """The chunk's pieces wait on its poll job now (in the submit job's fenced
    transaction)."""
    await on(conn, "chunk_sent", job=job_id, chunk=chunk)


async def dropped(conn: AsyncConnection[Any], chunk: str) -> None:
    """The batch was cancelled before the chunk's provider batch was made."""
    await on(conn, "chunk_cancel", chunk=chunk)


async def settle(
    conn: AsyncConnection[Any],
    rt: EvalRuntime,
    pipe_hash: str,
    batch: str,
    chunk: str,
    good: dict[str, dict[str, Any]],
    failed: dict[str, str],
    cancelled: bool,
) -> None:
    """A chunk's provider batch ended: in the poll job's fenced transaction, each
    answered key ends the pieces that asked it and runs their fan-in; the failed keys
    go to a job each (or, cancelled, end cancelled)."""
    pipe = await load_pipeline(rt, pipe_hash)
    for key, value in good.items():
        result = Jsonb({"key": key, "source": "batch", **value})
        ended = await on(conn, "chunk_key_end", status="done", source="batch", result=result,
                         error=None, chunk=chunk, key=key)  # fmt: skip
        for path, stage, round_ in ended:
            await advance(conn, pipe, batch, path, stage, round_)
    if failed and cancelled:
        await on(conn, "chunk_cancel", chunk=chunk)
    elif failed:
        await on(conn, "chunk_to_sync", chunk=chunk, keys=list(failed))


async def after_settle(app: App, rt: EvalRuntime, pipe_hash: str, batch: str) -> None:
    """After the commit: the next batched stage's pieces of every document the provider
    batch completed gathered at once, the retries and other stages' pieces sent."""
    await gather(app, rt, await load_pipeline(rt, pipe_hash), batch)
