"""LLM evaluations over HTTP: documents come in the request body, not from server paths
(a client must not make the server read, and send to a provider, files of its choosing)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status

from herd.api.deps import HerdApp
from herd.api.models import (
    BatchName,
    BatchPage,
    BudgetIn,
    BudgetOut,
    CancelOut,
    ErrorOut,
    EvalIn,
    EvalOut,
    EvalStatusOut,
    PipelinePlanOut,
    PlanOut,
    ResultPage,
)
from herd.api.security import CALLER_KEY
from herd.cache.keys import normalize_document
from herd.errors import InvalidInput
from herd.llm import eval as evals
from herd.llm.eval import control, pipeline, plan, results
from herd.llm.eval.pipeplan import plan_pipeline_texts
from herd.llm.eval.pipesubmit import submit_pipeline_texts

router = APIRouter(tags=["evaluations"])
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such batch"}}


def _caller(request: Request) -> evals.Caller:
    """Who asks: the token sent (BearerAuth's note), or with no token configured the
    local owner, as the CLI (the server then answers loopback clients only)."""
    found = request.scope.get("state", {}).get(CALLER_KEY)
    return evals.Caller(*found) if found else evals.LOCAL


Caller = Annotated[evals.Caller, Depends(_caller)]


@router.post(
    "/evals",
    status_code=status.HTTP_201_CREATED,
    responses={409: {"model": ErrorOut, "description": "a batch name another caller made"}},
)
async def submit(
    body: EvalIn, app: HerdApp, caller: Caller, response: Response
) -> EvalOut | PlanOut | PipelinePlanOut:
    """Enqueue one evaluation per document; `herd worker` processes run them. Refused
    (422) before anything is enqueued: an invalid schema, a provider key that is not
    set, an unpriced model with a budget; (409) a batch name another caller made.
    With `"plan": true` nothing is enqueued: 200 and what it would cost and take."""
    given = {"rpm": body.rpm, "tpm": body.tpm, "max_concurrent": body.max_concurrent,
             "weight": body.weight}  # fmt: skip
    limits = {k: v for k, v in given.items() if v is not None} or None
    documents = {d.name: d.text for d in body.documents}
    if body.pipeline is not None:
        pipe = pipeline.from_json(body.pipeline)
        if body.batch_api:  # every model stage through the Batch API
            pipe = pipe.through_batch_api()
        if body.plan:
            planned = await plan_pipeline_texts(app, pipe, documents, limits=limits,
                                                budget=body.budget, batch=body.batch,
                                                fallbacks=body.fallbacks)  # fmt: skip
            response.status_code = status.HTTP_200_OK
            return PipelinePlanOut.model_validate(planned.to_json())
        report = await submit_pipeline_texts(
            app, pipe, documents, batch=body.batch, priority=body.priority,
            budget=body.budget, limits=limits, caller=caller, fallbacks=body.fallbacks,
        )  # fmt: skip
        return EvalOut(batch=report.batch, queued=report.queued, deduplicated=0, job_ids=[])
    assert body.model is not None and body.system is not None  # EvalIn checked it
    spec = evals.EvalSpec(
        model=body.model,
        system=body.system,
        schema=body.json_schema,
        provider=body.provider,
        params=body.params,
    )
    if body.plan:
        from_texts = [(d.name, normalize_document(d.text)) for d in body.documents]
        found = await plan.plan_items(app, spec, from_texts, batch_api=body.batch_api,
                                      limits=limits, budget=body.budget,
                                      batch=body.batch, fallbacks=body.fallbacks)  # fmt: skip
        response.status_code = status.HTTP_200_OK
        return PlanOut.model_validate(found.to_json())
    report = await evals.submit_texts(
        app, spec, documents, batch=body.batch,
        priority=body.priority, budget=body.budget, limits=limits, batch_api=body.batch_api,
        caller=caller, fallbacks=body.fallbacks,
    )  # fmt: skip
    return EvalOut(batch=report.batch, queued=report.queued,
                   deduplicated=report.deduplicated, job_ids=report.job_ids)  # fmt: skip


def _cursor(value: str | None) -> tuple[datetime, str] | None:
    """A page cursor: the created time and name of the last batch seen."""
    if value is None:
        return None
    when, sep, name = value.partition("|")
    try:
        if not sep:
            raise ValueError(value)
        return datetime.fromisoformat(when), name
    except ValueError:
        raise InvalidInput("before: not a cursor this API gave", field="before") from None


@router.get("/evals")
async def list_batches(
    app: HerdApp,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    before: Annotated[str | None, Query(max_length=300)] = None,
) -> BatchPage:
    """The batches, newest first, a page at a time (``before``: the ``next`` of the
    page before)."""
    found = await evals.list_batches(app, limit=limit, before=_cursor(before))
    nxt = f"{found[-1]['created_at']}|{found[-1]['batch']}" if len(found) == limit else None
    return BatchPage.model_validate({"batches": found, "next": nxt})


@router.get("/evals/{batch}", responses=NOT_FOUND)
async def batch_status(
    batch: Annotated[BatchName, Path()], app: HerdApp, caller: Caller
) -> EvalStatusOut:
    """Progress of a batch, why it waits and what resumes it, failed documents by path,
    and its cost ledger (calls made and avoided)."""
    await _own(app, batch, caller)
    found = await evals.batch_status(app, batch)
    return EvalStatusOut.model_validate(found.to_json())


@router.get("/evals/{batch}/results", responses=NOT_FOUND)
async def batch_results(
    batch: Annotated[BatchName, Path()],
    app: HerdApp,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[str | None, Query(max_length=1000)] = None,
) -> ResultPage:
    """One row per document by path, dead ones with their error; ``after``: the ``next``
    of the page before."""
    await _own(app, batch, caller)
    rows = [r async for r in results.rows(app, batch, after=after, limit=limit)]
    return ResultPage.model_validate(
        {"results": rows, "next": rows[-1]["path"] if len(rows) == limit else None}
    )


@router.post("/evals/{batch}/budget", responses=NOT_FOUND)
async def set_budget(
    batch: Annotated[BatchName, Path()], body: BudgetIn, app: HerdApp, caller: Caller
) -> BudgetOut:
    """Raise or lower a batch's budget; a parked batch with room again resumes."""
    found = await evals.set_budget(app, batch, body.budget, caller=caller)
    return BudgetOut.model_validate({"batch": batch, **found})


@router.post("/evals/{batch}/resume", responses=NOT_FOUND)
async def resume_batch(
    batch: Annotated[BatchName, Path()], app: HerdApp, caller: Caller
) -> BudgetOut:
    """Continue a batch parked because the provider refused its key or model."""
    found = await evals.resume(app, batch, caller=caller)
    return BudgetOut.model_validate(found)


@router.post("/evals/{batch}/cancel", responses=NOT_FOUND)
async def cancel_batch(
    batch: Annotated[BatchName, Path()], app: HerdApp, caller: Caller
) -> CancelOut:
    """Stop a batch: no more calls for it, its provider batches cancelled; answers
    already paid for are kept."""
    return CancelOut.model_validate(await evals.cancel(app, batch, caller=caller))


async def _own(app: HerdApp, batch: str, caller: evals.Caller) -> None:
    """A batch's status and answers are its owner's (and the admin's) to read."""
    await control.check_owner(await evals.EvalRuntime.of(app), batch, caller)
