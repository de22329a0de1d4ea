"""LLM evaluations over HTTP: documents come in the request body, not from server paths
(a client must not make the server read, and send to a provider, files of its choosing)."""

from __future__ import annotations

import hashlib
import uuid

from fastapi import APIRouter, status

from herd.api.deps import HerdApp
from herd.api.models import EvalIn, EvalOut, EvalStatusOut
from herd.app import App
from herd.cache.keys import normalize_document
from herd.llm.evaluate import QUEUE, TASK, EvalRuntime, EvalSpec

router = APIRouter(tags=["evaluations"])


async def submit_texts(
    app: App, spec: EvalSpec, documents: dict[str, str], *, batch: str | None, priority: int
) -> EvalOut:
    """One evaluation job per document (name -> text); identical evaluations share a job.

    Stores what ``herd eval submit`` stores (documents, spec, items, dedup ledger
    rows), so ``herd eval status`` and ``results`` see API batches alike.
    """
    rt = await EvalRuntime.of(app)
    name = batch or f"eval-{uuid.uuid4().hex[:8]}"
    texts = {path: normalize_document(text) for path, text in documents.items()}
    hashes = {path: hashlib.sha256(text.encode()).hexdigest() for path, text in texts.items()}
    keys = {path: spec.key(text) for path, text in texts.items()}
    await rt.store.put_spec(spec)
    await rt.store.put_documents({hashes[p]: texts[p] for p in texts})
    paths = list(texts)
    results = await app.enqueue_many(
        TASK,
        [
            {"batch": name, "path": p, "doc": hashes[p], "spec": spec.hash, "key": keys[p]}
            for p in paths
        ],
        queue=QUEUE,
        priority=priority,
        dedup_keys=[keys[p] for p in paths],
    )
    await rt.store.execute(
        "INSERT INTO herd_eval_items (batch, path, key, job_id) SELECT %s, p, k, j FROM"
        " unnest(%s::text[], %s::text[], %s::bigint[]) AS x(p, k, j) ON CONFLICT DO NOTHING",
        (name, paths, [keys[p] for p in paths], [r.job_id for r in results]),
    )
    for path, r in zip(paths, results, strict=True):
        if not r.created:
            await rt.store.record(
                batch=name,
                job_id=r.job_id,
                key=keys[path],
                kind="dedup",
                model=spec.model,
                provider=spec.provider,
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
    return await submit_texts(app, spec, docs, batch=body.batch, priority=body.priority)


@router.get("/evals/{batch}")
async def batch_status(batch: str, app: HerdApp) -> EvalStatusOut:
    """Progress of a batch and its cost ledger (calls made and avoided)."""
    from herd.llm.cli import _status  # the same numbers as `herd eval status`

    return EvalStatusOut.model_validate(await _status(app, batch))
