"""LLM evaluations over HTTP: documents come in the request body, not from server paths
(a client must not make the server read, and send to a provider, files of its choosing)."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Path, status

from herd.api.deps import HerdApp
from herd.api.models import (
    BatchName,
    BudgetIn,
    BudgetOut,
    CancelOut,
    EvalIn,
    EvalOut,
    EvalStatusOut,
)
from herd.app import App
from herd.cache.keys import normalize_document
from herd.llm import batchapi, cancel, evaluate
from herd.llm.evaluate import EvalSpec, enqueue_documents

router = APIRouter(tags=["evaluations"])


async def submit_texts(
    app: App,
    spec: EvalSpec,
    documents: dict[str, str],
    *,
    batch: str | None,
    priority: int,
    budget: float | None = None,
    limits: dict[str, int] | None = None,
    batch_api: bool = False,
) -> EvalOut:
    """One evaluation job per document (name -> text), stored as ``herd eval submit``
    stores them, so ``herd eval status`` and ``results`` see API batches alike."""
    name = batch or f"eval-{uuid.uuid4().hex[:8]}"
    items = [(path, normalize_document(text)) for path, text in documents.items()]
    if batch_api:
        batchapi.check_provider(spec)
        batchapi.check_unlimited(budget, limits)
        results = await batchapi.enqueue_batch_documents(app, spec, name, items, priority=priority)
    else:
        results = await enqueue_documents(
            app, spec, name, items, priority=priority, budget=budget, limits=limits
        )
    created = sum(r.created for r in results)
    return EvalOut(
        batch=name,
        queued=created,
        deduplicated=len(results) - created,
        job_ids=[r.job_id for r in results],
    )


@router.post("/evals", status_code=status.HTTP_201_CREATED)
async def submit(body: EvalIn, app: HerdApp) -> EvalOut:
    """Enqueue one evaluation per document; `herd worker` processes run them."""
    spec = EvalSpec(
        model=body.model,
        system=body.system,
        schema=body.json_schema,
        provider=body.provider,
        params=body.params,
    )
    docs = {d.name: d.text for d in body.documents}
    given = {"rpm": body.rpm, "tpm": body.tpm, "max_concurrent": body.max_concurrent}
    limits = {k: v for k, v in given.items() if v is not None} or None
    return await submit_texts(
        app,
        spec,
        docs,
        batch=body.batch,
        priority=body.priority,
        budget=body.budget,
        limits=limits,
        batch_api=body.batch_api,
    )


@router.get("/evals/{batch}")
async def batch_status(batch: Annotated[BatchName, Path()], app: HerdApp) -> EvalStatusOut:
    """Progress of a batch and its cost ledger (calls made and avoided)."""
    return EvalStatusOut.model_validate(await evaluate.batch_status(app, batch))


@router.post("/evals/{batch}/budget", responses={404: {"description": "no such batch"}})
async def set_budget(
    batch: Annotated[BatchName, Path()], body: BudgetIn, app: HerdApp
) -> BudgetOut:
    """Raise or lower a batch's budget; a parked batch with room again resumes."""
    found = await evaluate.set_budget(app, batch, body.budget)
    return BudgetOut.model_validate({"batch": batch, **found})


@router.post("/evals/{batch}/cancel", responses={404: {"description": "no such batch"}})
async def cancel_batch(batch: Annotated[BatchName, Path()], app: HerdApp) -> CancelOut:
    """Stop a batch: no more calls for it, its provider batches cancelled; answers
    already paid for are kept."""
    return CancelOut.model_validate(await cancel.cancel(app, batch))
