"""A batch in stages seen per stage: progress, cache hits, cost and failures of each, and
any stage's answers per piece with where the piece came from."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from herd.app import App
from herd.errors import BatchNotFound, InvalidInput
from herd.llm.eval.pipeline import CallStage
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.spec import QUEUE
from herd.llm.eval.stages import Q, advance, load_pipeline, on, send_unsent
from herd.queue.base import Job, JobStatus

FAILURES_SHOWN = 50
PAGE = 500


async def stage_progress(rt: EvalRuntime, batch: str) -> list[dict[str, Any]]:
    """Per call stage of the batch's pipeline, in order: pieces made so far, done,
    failed, cancelled, answered from the cache, calls paid, tokens and cost (None:
    unpriced), the last round made (a reduce in rounds; else 1). Empty: not a batch in
    stages."""
    found = await rt.store.execute(Q["batch_pipeline"], {"b": batch})
    if not found:
        return []
    pipe = await load_pipeline(rt, found[0][0])
    counts = {r[0]: r[1:] for r in await rt.store.execute(Q["stage_counts"], {"b": batch})}
    costs = {r[0]: r[1:] for r in await rt.store.execute(Q["stage_costs"], {"b": batch})}
    out = []
    for stage in pipe.steps:
        n, done, failed, cancelled, cached, round_ = counts.get(stage.name, (0, 0, 0, 0, 0, 1))
        calls, i, o, cost, unpriced = costs.get(stage.name, (0, 0, 0, None, False))
        # A function stage has no model: its task's name in its place, and no provider.
        model = pipe.model_of(stage) if isinstance(stage, CallStage) else stage.task
        provider = (
            (stage.provider or pipe.defaults.provider) if isinstance(stage, CallStage) else None
        )
        out.append({"stage": stage.name, "kind": stage.kind, "model": model, "provider": provider,
                    "pieces": int(n), "done": int(done), "failed": int(failed),
                    "cancelled": int(cancelled), "cached": int(cached), "calls": int(calls),
                    "round": int(round_),
                    "input_tokens": int(i), "output_tokens": int(o),
                    "cost": None if unpriced or cost is None else float(cost)})  # fmt: skip
    return out


async def running_documents(
    rt: EvalRuntime, batches: list[str] | None, leased: list[int]
) -> dict[str, int]:
    """Per batch of ``batches`` (all: None), its documents with a piece on one of the
    ``leased`` jobs: a pipeline's running documents (its items wait on no job of their
    own)."""
    rows = await rt.store.execute(Q["running_documents"], {"batches": batches, "jobs": leased})
    return {b: int(n) for b, n in rows}


async def stage_models(rt: EvalRuntime, batches: list[str]) -> dict[str, set[tuple[str, str]]]:
    """(provider, model) of each call stage, per batch of ``batches`` in stages."""
    out: dict[str, set[tuple[str, str]]] = {}
    for batch, pipe_hash in await rt.store.execute(Q["batches_pipelines"], {"batches": batches}):
        if pipe_hash is not None:
            pipe = await load_pipeline(rt, pipe_hash)
            out[batch] = {
                (s.provider or pipe.defaults.provider, pipe.model_of(s)) for s in pipe.calls
            }
    return out


# A status read finds the pieces whose jobs died uncounted at a cost of its own, never of
# the batch's waiting pieces (a poll of 18,200 waiting pieces fetched every one's job:
# 575 ms): among the queue's newest dead jobs (DEAD_LOOKED), and by a sweep of the jobs
# of SWEEP waiting pieces a read, each read going on where the last left off in this
# process, so that deaths older than the newest dead letters are found too.
DEAD_LOOKED = 100
SWEEP = 200
_swept: OrderedDict[str, tuple[str, str, int, int]] = OrderedDict()  # batch: last piece
SWEPT_BATCHES = 1000


async def _dead_of(app: App, rt: EvalRuntime, batch: str) -> dict[int, Job]:
    """Dead jobs of the batch's waiting pieces, by id: those of the sweep's next SWEEP
    waiting pieces, and the newest of the queue. Nothing is asked of the broker for a
    batch with no piece waiting on a job (a page read of an index says so)."""
    after = _swept.pop(batch, None)
    path, stage, round_, seq = after or ("", "", 0, 0)
    rows = await rt.store.execute(
        Q["sweep_pieces"],
        {"b": batch, "after": after is not None, "path": path, "stage": stage,
         "round": round_, "seq": seq, "limit": SWEEP},
    )  # fmt: skip
    if len(rows) == SWEEP:  # more to sweep: the next read goes on from here
        _swept[batch] = rows[-1][:4]
        while len(_swept) > SWEPT_BATCHES:
            _swept.popitem(last=False)
    if not rows and after is None:
        return {}
    dead = {j.id: j for j in await app.broker.list_jobs(status=JobStatus.DEAD, queue=QUEUE,
                                                        limit=DEAD_LOOKED)}  # fmt: skip
    ids = sorted({job for *_, job in rows} - set(dead))
    if ids:
        dead.update({j.id: j for j in await app.broker.get_jobs(ids)
                     if j.status == JobStatus.DEAD})  # fmt: skip
    return dead


async def settle_pieces(app: App, rt: EvalRuntime, batch: str) -> int:
    """Count as failed the pieces whose job is dead-lettered without its task having
    counted them (its lease expired too often: a worker killed on every attempt), and
    run their stage's fan-in as the task would have. The job is dead, so no run of it
    can count the piece too; the move out of 'queued' is conditional all the same.
    Returns how many were settled."""
    jobs = await _dead_of(app, rt, batch)
    if not jobs:
        return 0
    waiting = await rt.store.execute(Q["waiting_pieces"], {"b": batch, "jobs": list(jobs)})
    if not waiting:
        return 0
    found = await rt.store.execute(Q["batch_pipeline"], {"b": batch})
    pipe = await load_pipeline(rt, found[0][0])
    settled = 0
    for path, stage, round_, seq, job_id in waiting:
        job = jobs[job_id]
        error = job.last_error or job.dead_reason or "dead-lettered"
        async with rt.store.transaction() as conn:
            ended = await on(conn, "piece_end", status="failed", source=None, result=None,
                             error=str(error)[:2000], b=batch, path=path, stage=stage,
                             round=round_, seq=seq)  # fmt: skip
            if ended:
                await advance(conn, pipe, batch, path, stage, round_)
                settled += 1
        await send_unsent(app, rt, pipe, batch, path, int(job.payload.get("priority", 0)))
    return settled


async def doc_calls(rt: EvalRuntime, batch: str, paths: list[str]) -> dict[str, tuple[Any, ...]]:
    """Per document of a pipeline, what its calls of every stage cost: (input, cached
    input, output tokens, cost, any unpriced, first at, last at, calls)."""
    if not paths:
        return {}
    rows = await rt.store.execute(Q["doc_calls"], {"b": batch, "paths": paths})
    return {p: (int(i), int(ci), int(o), c, unpriced, a, z, int(n))
            for p, i, ci, o, c, unpriced, a, z, n in rows}  # fmt: skip


async def failed_documents(rt: EvalRuntime, batch: str) -> tuple[int, list[dict[str, Any]]]:
    """How many of the batch's documents a stage failed, and the first of them: (path,
    job 0 (a pipeline's document has none of its own), error naming the stage and the
    piece)."""
    ((n,),) = await rt.store.execute(Q["failed_count"], {"b": batch})
    rows = await rt.store.execute(Q["failed_docs"], {"b": batch, "limit": FAILURES_SHOWN})
    return int(n), [
        {"path": p, "job": 0, "error": (r or {}).get("error") or "failed"} for p, r in rows
    ]


async def stage_rows(app: App, batch: str, stage: str) -> AsyncIterator[dict[str, Any]]:
    """A stage's answers per piece, by document, round and piece: path, round (a reduce
    in rounds; else 1), piece, status, source, location (page, section, id, window,
    chars; a reduce's piece: the map pieces it read), output, error."""
    rt = await EvalRuntime.of(app)
    found = await rt.store.execute(Q["batch_pipeline"], {"b": batch})
    if not found:
        if not await rt.store.exists(batch):
            raise BatchNotFound(f"no batch named {batch!r}; `herd eval list` shows them")
        raise InvalidInput(f"--stage: batch {batch!r} has one stage only", field="stage")
    pipe = await load_pipeline(rt, found[0][0])
    names = [s.name for s in pipe.steps]
    if stage not in names:
        raise InvalidInput(
            f"--stage: {stage!r} is not a stage of batch {batch!r}"
            f" (its stages: {', '.join(names)})",
            field="stage",
        )
    after: tuple[str | None, int, int] = (None, 0, 0)
    while True:
        page = await rt.store.execute(
            Q["stage_results"],
            {"b": batch, "stage": stage, "after": after[0], "after_round": after[1],
             "after_seq": after[2], "limit": PAGE},
        )  # fmt: skip
        for path, round_, seq, status, source, result, error, loc in page:
            yield {"path": path, "stage": stage, "round": round_, "piece": seq,
                   "status": status, "source": source, "loc": loc or {},
                   "output": (result or {}).get("output"), "error": error}  # fmt: skip
        if len(page) < PAGE:
            return
        after = (page[-1][0], page[-1][1], page[-1][2])
