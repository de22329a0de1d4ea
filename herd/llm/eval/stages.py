"""An evaluation in stages on the fenced queue: one job per call of a stage (a piece of
a map, a document's reduce or chain), each cached by what it reads, and a fan-in that is
exact under crashes.

A piece's job answers it as herd.eval answers a document (the exact cache, the
singleflight lock, the ledger, the budget), then, in one transaction fenced by its
lease, moves the piece from queued to done (or failed) and, only if it made that move,
counts it off its document's open pieces. The completion that brings the count to zero
reads the stage's answers in document order and writes the next stage's piece (its
input stored, its key computed) in that same transaction, or the document's final
answer. The next piece is written with no job (an outbox row); the job that wrote it
enqueues it after the commit, under a dedup key of the piece, and only then completes:
a worker killed in between leaves its job to be run again, and the run again finds the
piece already counted, counts nothing, and enqueues what is still unsent. Both brokers
alike: no broker's enqueue has to join the store's transaction, and no poller looks for
documents whose count reached zero.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from herd.app import App
from herd.db.queries import named
from herd.errors import Fatal, InvalidInput, LeaseLost, Snooze
from herd.jsonvalue import JSON, canonical
from herd.llm.eval.pipeline import Pipeline, from_json
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.spec import QUEUE, BatchCancelled, EvalSpec
from herd.llm.eval.store import EvalStore
from herd.llm.eval.task import answer, fenced
from herd.queue.base import EnqueueResult
from herd.tasks import JobContext

STAGE_TASK = "herd.eval.stage"
Q = named("herd.llm.eval", "pipeline.sql")


async def on(conn: AsyncConnection[Any], name: str, **params: Any) -> list[tuple[Any, ...]]:
    cur = await conn.execute(Q[name], params)
    return await cur.fetchall() if cur.description else []


def piece_dedup(batch: str, path: str, stage: str, seq: int) -> str:
    """The dedup key of a piece's job: one active job per piece, whoever enqueues it."""
    return "pipe:" + hashlib.sha256(canonical([batch, path, stage, seq]).encode()).hexdigest()


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def put_stage_input(
    conn: AsyncConnection[Any],
    spec: EvalSpec,
    batch: str,
    path: str,
    stage: str,
    pieces: list[tuple[str, dict[str, Any]]],
) -> None:
    """A stage's pieces of one document (input text and location each), their texts and
    spec stored, in the caller's transaction; no job yet (see send_unsent)."""
    texts = {text_hash(t): t for t, _ in pieces}
    await EvalStore.on(conn, "put_documents", hashes=list(texts), texts=list(texts.values()))
    await EvalStore.on(conn, "put_spec", hash=spec.hash, spec=Jsonb(asdict(spec)))
    await on(conn, "put_pieces", b=batch, path=path, stage=stage, spec=spec.hash,
             seqs=list(range(len(pieces))), keys=[spec.key(t) for t, _ in pieces],
             docs=[text_hash(t) for t, _ in pieces],
             locs=[Jsonb(loc) for _, loc in pieces])  # fmt: skip


async def send_unsent(
    app: App, rt: EvalRuntime, pipe_hash: str, batch: str, path: str | None, priority: int = 0
) -> list[EnqueueResult]:
    """Enqueue the pieces decided but not yet sent (of a document, or of a whole batch:
    ``path`` None), each under its piece's dedup key, and record their jobs."""
    rows = await rt.store.execute(Q["unsent"], {"b": batch, "path": path})
    if not rows:
        return []
    results = await app.enqueue_many(
        STAGE_TASK,
        [{"batch": batch, "path": p, "stage": st, "seq": seq, "key": k, "spec": s, "doc": d,
          "pipeline": pipe_hash} for p, st, seq, k, s, d in rows],
        queue=QUEUE,
        priority=priority,
        dedup_keys=[piece_dedup(batch, p, st, seq) for p, st, seq, *_ in rows],
    )  # fmt: skip
    for (p, st, seq, *_), r in zip(rows, results, strict=True):
        await rt.store.execute(
            Q["sent"], {"job": r.job_id, "b": batch, "path": p, "stage": st, "seq": seq}
        )
    return results


async def load_pipeline(rt: EvalRuntime, pipe_hash: str) -> Pipeline:
    rows = await rt.store.execute(Q["pipeline"], {"hash": pipe_hash})
    if not rows:
        raise Fatal(f"pipeline {pipe_hash[:12]}… is not stored")
    try:
        return from_json(rows[0][0])
    except InvalidInput as exc:
        raise Fatal(f"pipeline {pipe_hash[:12]}… is refused: {exc}") from None


def _where(seq: int, loc: dict[str, Any]) -> str:
    parts = [f"piece {seq}"]
    if "page" in loc:
        parts.append(f"page {loc['page']}")
    if "section" in loc:
        parts.append(f"section {loc['section']!r}")
    if "chars" in loc:
        parts.append(f"chars {loc['chars'][0]}-{loc['chars'][1]}")
    return ", ".join(parts)


async def advance(
    conn: AsyncConnection[Any], pipe: Pipeline, batch: str, path: str, name: str
) -> None:
    """After a piece of stage ``name`` ended (counted once): when it was the document's
    last open piece of that stage, decide what comes next, in the caller's (fenced)
    transaction: the next stage's input, or the document's answer or failure."""
    stage = pipe.stage(name)
    where = {"b": batch, "path": path}
    if stage.kind == "map":
        ((left,),) = await on(conn, "fanin_step", stage=name, **where)
        if left > 0:
            return
    answers = await on(conn, "stage_answers", stage=name, **where)
    gaps = [(seq, st, err, loc) for seq, st, _, err, loc in answers if st != "done"]
    if gaps and (stage.kind != "map" or stage.on_dead == "fail"):
        seq, st, err, loc = gaps[0]
        error = f"stage {name!r}: {_where(seq, loc)} {st}: {err or st}"
        await on(conn, "doc_failed", result=Jsonb({"error": error, "stage": name}), **where)
        return
    if stage.kind == "map":
        # In document order, a dead piece (on_dead = "skip") marked where it was.
        value: JSON = [
            {"piece": seq, "loc": loc, "answer": res["output"]}
            if st == "done"
            else {"piece": seq, "loc": loc, "missing": err or st}
            for seq, st, res, err, loc in answers
        ]
        model = None
    else:
        value, model = answers[0][2]["output"], answers[0][2].get("model")
    nxt = pipe.after(name)
    if nxt is None:
        result = {"output": value, "stage": name, "model": model}
        await on(conn, "doc_done", source="pipeline", result=Jsonb(result), **where)
        return
    await put_stage_input(conn, pipe.spec(nxt), batch, path, nxt.name, [(canonical(value), {})])


async def end_piece(
    ctx: JobContext,
    rt: EvalRuntime,
    pipe: Pipeline,
    payload: dict[str, Any],
    status: str,
    *,
    source: str | None = None,
    result: JSON = None,
    error: str | None = None,
) -> None:
    """The piece's one move out of 'queued' and, if this run made it, the fan-in step:
    one transaction, committed only while this job's lease holds."""
    where = {"b": payload["batch"], "path": payload["path"], "stage": payload["stage"],
             "seq": payload["seq"]}  # fmt: skip
    async with fenced(ctx, rt.store) as conn:
        ended = await on(conn, "piece_end", status=status, source=source,
                         result=None if result is None else Jsonb(result), error=error,
                         **where)  # fmt: skip
        if ended:
            await advance(conn, pipe, payload["batch"], payload["path"], payload["stage"])


def _last_attempt(ctx: JobContext) -> bool:
    return ctx.lease.attempts + 1 >= ctx.lease.max_attempts


async def run_stage(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The built-in task of a pipeline's call (registered in herd.builtin)."""
    rt = await EvalRuntime.of(ctx.app)
    batch, path, key = payload["batch"], payload["path"], payload["key"]
    await rt.store.cut_short(ctx.job_id)
    pipe = await load_pipeline(rt, payload["pipeline"])
    where = {"b": batch, "path": path, "stage": payload["stage"], "seq": payload["seq"]}
    found_rows = await rt.store.execute(Q["piece"], where)
    if not found_rows:
        raise Fatal(f"{path}: piece {payload['seq']} of stage {payload['stage']!r} is not stored")
    source = "done"
    if found_rows[0][0] == "queued":
        source = await _answer(ctx, rt, pipe, payload)
    # Sent after the commit, before this job completes: see the module's docstring.
    await send_unsent(ctx.app, rt, payload["pipeline"], batch, path)
    return {"key": key, "path": path, "stage": payload["stage"], "seq": payload["seq"],
            "source": source}  # fmt: skip


async def _answer(ctx: JobContext, rt: EvalRuntime, pipe: Pipeline, payload: dict[str, Any]) -> str:
    spec = await rt.store.spec(payload["spec"])
    try:
        spec.check(ctx.app.settings)
    except InvalidInput as exc:
        raise Fatal(str(exc)) from None
    text = await rt.store.document(payload["doc"])
    fallbacks = await rt.store.fallbacks(payload["batch"])
    try:
        # As a one-prompt evaluation: the exact cache, the limits, the batch's fallbacks.
        found, *_ = await answer(rt, ctx, payload, spec, text, fallbacks)
    except BatchCancelled:
        await rt.store.execute(Q["cancel_pieces"], {"b": payload["batch"], "path": payload["path"],
                                                   "stage": payload["stage"],
                                                   "seq": payload["seq"]})  # fmt: skip
        return "cancelled"
    except (Snooze, LeaseLost):
        raise
    except Exception as exc:
        # A piece that will not be answered: its document's policy decides now, from
        # the run that gives up (a Fatal, or the last attempt's error).
        if isinstance(exc, Fatal) or _last_attempt(ctx):
            await end_piece(ctx, rt, pipe, payload, "failed", error=str(exc)[:2000])
        raise
    await end_piece(ctx, rt, pipe, payload, "done", source=found.source, result=found.value)
    return found.source
