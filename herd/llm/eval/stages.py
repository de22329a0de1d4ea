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
from herd.context import JobContext
from herd.db.queries import named
from herd.errors import Fatal, InvalidInput, LeaseLost, Snooze
from herd.jsonvalue import JSON, canonical, loads
from herd.llm.eval import functions, rounds
from herd.llm.eval.pipeline import (
    CallStage,
    FunctionStage,
    Pipeline,
    Step,
    per_piece,
)
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.spec import QUEUE, BatchCancelled, EvalSpec, in_turns
from herd.llm.eval.store import EvalStore
from herd.llm.eval.task import answer, fenced
from herd.queue.base import MAX_PRIORITY, EnqueueResult

STAGE_TASK = "herd.eval.stage"
GATHER_TASK = "herd.eval.stage_gather"
# Seconds a piece of a stage through the Batch API waits for others to share its
# provider batch, when it was decided alone (a document's reduce after synchronous maps).
GATHER_AFTER = 2.0
# A batched stage's piece answered by a job of its own (herd_eval_pieces.chunk).
SYNC = "sync"
Q = named("herd.llm.eval", "pipeline.sql")


async def on(conn: AsyncConnection[Any], name: str, **params: Any) -> list[tuple[Any, ...]]:
    cur = await conn.execute(Q[name], params)
    return await cur.fetchall() if cur.description else []


def piece_dedup(batch: str, path: str, stage: str, seq: int, round_: int = 1) -> str:
    """The dedup key of a piece's job: one active job per piece, whoever enqueues it."""
    address: list[JSON] = [batch, path, stage, seq] + ([round_] if round_ != 1 else [])
    return "pipe:" + hashlib.sha256(canonical(address).encode()).hexdigest()


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


async def put_stage_input(
    conn: AsyncConnection[Any],
    spec: EvalSpec,
    batch: str,
    path: str,
    stage: str,
    pieces: list[tuple[str, dict[str, Any]]],
    round_: int = 1,
    seqs: list[int] | None = None,
) -> None:
    """A stage's pieces of one document (input text and location each), their texts and
    spec stored, in the caller's transaction; no job yet (see send_unsent)."""
    await EvalStore.on(conn, "put_spec", hash=spec.hash, spec=Jsonb(asdict(spec)))
    await _put_pieces(conn, spec.hash, [spec.key(t) for t, _ in pieces], batch, path, stage,
                      pieces, round_, seqs)  # fmt: skip


async def _put_pieces(
    conn: AsyncConnection[Any],
    spec: str,
    keys: list[str],
    batch: str,
    path: str,
    stage: str,
    pieces: list[tuple[str, dict[str, Any]]],
    round_: int,
    seqs: list[int] | None,
) -> None:
    texts = {text_hash(t): t for t, _ in pieces}
    await EvalStore.on(conn, "put_documents", hashes=list(texts), texts=list(texts.values()))
    await on(conn, "put_pieces", b=batch, path=path, stage=stage, round=round_, spec=spec,
             seqs=seqs if seqs is not None else list(range(len(pieces))), keys=keys,
             docs=[text_hash(t) for t, _ in pieces],
             locs=[Jsonb(loc) for _, loc in pieces])  # fmt: skip


async def put_step_input(
    conn: AsyncConnection[Any],
    pipe: Pipeline,
    step: Step,
    batch: str,
    path: str,
    pieces: list[tuple[str, dict[str, Any]]],
    seqs: list[int] | None = None,
) -> None:
    """A stage's pieces of one document, whether it calls a model or a function."""
    if isinstance(step, CallStage):
        await put_stage_input(conn, pipe.spec(step), batch, path, step.name, pieces, 1, seqs)
        return
    keys = [functions.key_of(step, t) for t, _ in pieces]
    await _put_pieces(conn, functions.spec_of(step), keys, batch, path, step.name, pieces, 1,
                      seqs)  # fmt: skip


def item_spec(pipe: Pipeline) -> str:
    """The spec a pipeline's document item names: its last model stage's (its model is
    what results show), or its last function's."""
    if pipe.calls:
        return pipe.spec(pipe.calls[-1]).hash
    last = pipe.last
    assert isinstance(last, FunctionStage)
    return functions.spec_of(last)


async def send_unsent(
    app: App,
    rt: EvalRuntime,
    pipe: Pipeline,
    batch: str,
    path: str | None,
    priority: int = 0,
    *,
    gather_now: bool = False,
) -> list[EnqueueResult]:
    """Enqueue the pieces decided but not yet sent (of a document, or of a whole batch:
    ``path`` None), each under its piece's dedup key, and record their jobs. The pieces
    of a stage through the Batch API are left to a gathering job (herd.llm.eval.pipebatch)
    instead: at once (``gather_now``: a submission, a provider batch settled, where every
    piece ready together was written together), else GATHER_AFTER seconds later, so that
    the documents whose pieces end one by one share a provider batch."""
    rows = await rt.store.execute(Q["unsent"], {"b": batch, "path": path})
    batched = set(pipe.batched)
    gather = [r for r in rows if r[1] in batched and r[7] != SYNC]
    rows = [r[:7] for r in rows if r[1] not in batched or r[7] == SYNC]
    if gather:
        # One gathering job per set of pieces: a run again (after a crash) finds it.
        address = canonical([batch] + [list(r[:4]) for r in gather])
        await app.enqueue(
            GATHER_TASK,
            {"batch": batch, "pipeline": pipe.hash, "priority": priority},
            queue=QUEUE,
            priority=priority,
            dedup_key="pipe-gather:" + hashlib.sha256(address.encode()).hexdigest(),
            delay=0.0 if gather_now else GATHER_AFTER,
        )
    if not rows:
        return []
    # One enqueue per stage: each stage's jobs at the batch's priority plus its rank.
    results: dict[tuple[Any, ...], EnqueueResult] = {}
    by_stage: dict[str, list[tuple[Any, ...]]] = {}
    for r in rows:
        by_stage.setdefault(r[1], []).append(r)
    for stage, group in by_stage.items():
        made = await app.enqueue_many(
            STAGE_TASK,
            [{"batch": batch, "path": p, "stage": st, "round": rd, "seq": seq, "key": k,
              "spec": s, "doc": d, "pipeline": pipe.hash, "priority": priority}
             for p, st, rd, seq, k, s, d in group],
            queue=QUEUE,
            priority=min(priority + pipe.rank(stage), MAX_PRIORITY),
            dedup_keys=[piece_dedup(batch, p, st, seq, rd) for p, st, rd, seq, *_ in group],
            **in_turns(batch, len(group)),
        )  # fmt: skip
        results.update({r[:4]: m for r, m in zip(group, made, strict=True)})
    sent = [r[:4] for r in rows]
    await rt.store.execute(
        Q["sent"],
        {"b": batch, "jobs": [results[r].job_id for r in sent],
         "paths": [r[0] for r in sent], "stages": [r[1] for r in sent],
         "rounds": [r[2] for r in sent], "seqs": [r[3] for r in sent]},
    )  # fmt: skip
    return [results[r[:4]] for r in rows]


async def load_pipeline(rt: EvalRuntime, pipe_hash: str) -> Pipeline:
    return await rt.store.pipeline(pipe_hash)


def _where(seq: int, loc: dict[str, Any]) -> str:
    parts = [f"piece {seq}"]
    if "round" in loc:
        parts[0] = f"round {loc['round']} piece {seq} (map pieces {loc['pieces'][0]}"
        parts[0] += f"-{loc['pieces'][1]})"
    if "page" in loc:
        parts.append(f"page {loc['page']}")
    if "section" in loc:
        parts.append(f"section {loc['section']!r}")
    if "chars" in loc:
        parts.append(f"chars {loc['chars'][0]}-{loc['chars'][1]}")
    return ", ".join(parts)


async def put_round(
    conn: AsyncConnection[Any],
    pipe: Pipeline,
    stage: CallStage,
    batch: str,
    path: str,
    round_: int,
    items: list[JSON],
) -> None:
    """A reduce's round over ``items``: one piece if they fit its model's context (the
    last round), else one per batch that fits, with the round's fan-in count."""
    spec = pipe.spec(stage)
    batches = rounds.group(items, spec, pipe.context_of(spec.model))
    located: dict[str, Any] = {"round": round_} if round_ > 1 or len(batches) > 1 else {}
    pieces = [(canonical(b), {**located, "pieces": rounds.span(b)}) for b in batches]
    await put_stage_input(conn, spec, batch, path, stage.name, pieces, round_)
    if len(batches) > 1:
        await on(conn, "put_round_fanin", b=batch, path=path, stage=stage.name, round=round_,
                 open=len(batches), n=len(batches))  # fmt: skip


async def advance(
    conn: AsyncConnection[Any], pipe: Pipeline, batch: str, path: str, name: str, round_: int = 1
) -> None:
    """After a piece of stage ``name`` (of round ``round_``) ended, counted once: when it
    was the document's last open piece of that stage's round, decide what comes next,
    in the caller's (fenced) transaction: a reduce's next round, the next stage's input,
    or the document's answer or failure."""
    # No fan-in row: the round is one piece (a reduce that fits, a chain).
    left = await on(conn, "fanin_step", b=batch, path=path, stage=name, round=round_)
    if left and left[0][0] > 0:
        return
    await _decide(conn, pipe, batch, path, name, round_)


async def _put_next_pieces(
    conn: AsyncConnection[Any],
    pipe: Pipeline,
    step: Step,
    batch: str,
    path: str,
    before: str,
    answers: list[tuple[Any, ...]],
) -> None:
    """A stage per piece after another: piece for piece, each reading the answer of the
    same piece (same number and location); a piece dead before stays dead here, named,
    so that the stage's policy decides at its end, with the gap where it was."""
    done = [(seq, res, loc) for seq, st, res, _, loc in answers if st == "done"]
    dead = [(seq, st, err, loc) for seq, st, _, err, loc in answers if st != "done"]
    await put_step_input(conn, pipe, step, batch, path,
                         [(canonical(res["output"]), loc) for _, res, loc in done],
                         [seq for seq, *_ in done])  # fmt: skip
    if dead:
        await put_step_input(conn, pipe, step, batch, path,
                             [(canonical({"missing": err or st}), loc) for _, st, err, loc in dead],
                             [seq for seq, *_ in dead])  # fmt: skip
        for seq, st, err, loc in dead:
            await on(conn, "piece_end", status="failed", source=None, result=None,
                     error=f"stage {before!r}: {_where(seq, loc)} {st}: {err or st}", b=batch,
                     path=path, stage=step.name, round=1, seq=seq)  # fmt: skip
    await on(conn, "put_round_fanin", b=batch, path=path, stage=step.name, round=1,
             open=len(done), n=len(answers))  # fmt: skip
    if not done:
        await _decide(conn, pipe, batch, path, step.name, 1)


async def _decide(
    conn: AsyncConnection[Any], pipe: Pipeline, batch: str, path: str, name: str, round_: int
) -> None:
    """What follows a stage's round whose every piece ended (see advance)."""
    stage = pipe.stage(name)
    where = {"b": batch, "path": path}
    answers = await on(conn, "stage_answers", stage=name, round=round_, **where)
    gaps = [(seq, st, err, loc) for seq, st, _, err, loc in answers if st != "done"]
    many = per_piece(stage)
    if gaps and (not many or stage.on_dead == "fail"):
        seq, st, err, loc = gaps[0]
        error = f"stage {name!r}: {_where(seq, loc)} {st}: {err or st}"
        await on(conn, "doc_failed", result=Jsonb({"error": error, "stage": name}), **where)
        return
    nxt = pipe.after(name)
    if many and nxt is not None and per_piece(nxt):
        await _put_next_pieces(conn, pipe, nxt, batch, path, name, answers)
        return
    if many:
        # In document order, a dead piece (on_dead = "skip") marked where it was.
        value: JSON = [
            {"piece": seq, "loc": loc, "answer": res["output"]}
            if st == "done"
            else {"piece": seq, "loc": loc, "missing": err or st}
            for seq, st, res, err, loc in answers
        ]
        model = None
    elif len(answers) > 1:
        # A round of a reduce ended: the next round reads its answers, in order.
        assert isinstance(stage, CallStage)
        parts: list[JSON] = [
            {"part": seq, "pieces": loc["pieces"], "answer": res["output"]}
            for seq, _, res, _, loc in answers
        ]
        await put_round(conn, pipe, stage, batch, path, round_ + 1, parts)
        return
    else:
        value, model = answers[0][2]["output"], answers[0][2].get("model")
    if nxt is None:
        result = {"output": value, "stage": name, "model": model}
        if round_ > 1:
            result["rounds"] = round_
        await on(conn, "doc_done", source="pipeline", result=Jsonb(result), **where)
        return
    if isinstance(nxt, CallStage) and nxt.kind == "reduce":
        assert isinstance(value, list)
        await put_round(conn, pipe, nxt, batch, path, 1, value)
        return
    await put_step_input(conn, pipe, nxt, batch, path, [(canonical(value), {})])


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
    where = piece_where(payload)
    async with fenced(ctx, rt.store) as conn:
        ended = await on(conn, "piece_end", status=status, source=source,
                         result=None if result is None else Jsonb(result), error=error,
                         **where)  # fmt: skip
        if ended:
            await advance(conn, pipe, payload["batch"], payload["path"], payload["stage"],
                          where["round"])  # fmt: skip


def piece_where(payload: dict[str, Any]) -> dict[str, Any]:
    """A piece's address from its job's payload (a job enqueued before rounds: round 1)."""
    return {"b": payload["batch"], "path": payload["path"], "stage": payload["stage"],
            "round": payload.get("round", 1), "seq": payload["seq"]}  # fmt: skip


def _last_attempt(ctx: JobContext) -> bool:
    return ctx.lease.attempts + 1 >= ctx.lease.max_attempts


async def run_stage(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The built-in task of a pipeline's call (registered in herd.builtin)."""
    rt = await EvalRuntime.of(ctx.app)
    batch, path, key = payload["batch"], payload["path"], payload["key"]
    await rt.store.cut_short(ctx.job_id)
    pipe = await load_pipeline(rt, payload["pipeline"])
    found_rows = await rt.store.execute(Q["piece"], piece_where(payload))
    if not found_rows:
        raise Fatal(f"{path}: piece {payload['seq']} of stage {payload['stage']!r} is not stored")
    source = "done"
    step = pipe.stage(payload["stage"])
    if found_rows[0][0] == "queued" and isinstance(step, FunctionStage):
        source = await _run_function(ctx, rt, pipe, step, payload)
    elif found_rows[0][0] == "queued":
        source = await _answer(ctx, rt, pipe, payload)
    # Sent after the commit, before this job completes: see the module's docstring.
    await send_unsent(ctx.app, rt, pipe, batch, path, int(payload.get("priority", 0)))
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
        await rt.store.execute(Q["cancel_pieces"], piece_where(payload))
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


async def _run_function(
    ctx: JobContext, rt: EvalRuntime, pipe: Pipeline, step: FunctionStage, payload: dict[str, Any]
) -> str:
    """A function stage's piece: the function over what it reads, cached by its key (a
    re-run or a twin piece answered from the cache), no ledger row; ended as a call's
    piece is, in the fenced transaction."""
    try:
        fn = functions.resolve(ctx.app, step.task)
    except InvalidInput as exc:
        raise Fatal(f"stage {step.name!r}: {exc}") from None
    text = await rt.store.document(payload["doc"])
    value: JSON = text if pipe.reads_text(step) else loads(text)

    async def compute() -> JSON:
        return {"output": await functions.call(fn, value), "function": step.task}

    try:
        await ctx.check_lease()
        found = await rt.cache.get_or_compute(
            payload["key"], compute, owner=f"herd-job:{ctx.job_id}"
        )
    except (Snooze, LeaseLost):
        raise
    except Exception as exc:
        if isinstance(exc, Fatal) or _last_attempt(ctx):
            await end_piece(ctx, rt, pipe, payload, "failed", error=str(exc)[:2000])
        raise
    await end_piece(ctx, rt, pipe, payload, "done", source=found.source, result=found.value)
    return found.source
