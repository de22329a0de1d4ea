"""Cancelling an evaluation batch: ``herd eval cancel BATCH``, ``POST /evals/{batch}/cancel``.

What has been paid for is kept: answers already in the exact cache or delivered by a
provider batch before it stopped stay and are served. Everything else stops:

* the batch is marked cancelled in the same transaction that marks its waiting items
  'cancelled', so no job of it opens a call afterwards (the budget's reservation reads
  that mark, herd.llm.evaluate), and no later submission adds to it;
* the jobs of those items are brought forward to end now instead of waiting out a
  budget park;
* each provider batch it submitted is cancelled at the provider here, and again by its
  poll job, which files what the provider answered before it stopped.
"""

from __future__ import annotations

import logging
from typing import Any

from herd.app import App
from herd.errors import HerdError
from herd.llm import batchapi
from herd.llm.evaluate import EvalRuntime

log = logging.getLogger(__name__)


async def cancel(app: App, batch: str) -> dict[str, Any]:
    """Cancel ``batch`` (BatchNotFound if there is none). Returns the items cancelled,
    the provider batches asked to stop, and those whose cancel failed (their poll jobs
    ask again)."""
    rt = await EvalRuntime.of(app)
    jobs, provider_batches = await rt.store.cancel(batch)
    if jobs:
        await app.broker.reschedule(jobs, 0)
    asked: list[str] = []
    failed: list[dict[str, str]] = []
    for _handle, spec_hash, batch_id in provider_batches:
        if batch_id is None:  # being submitted: its submit job sees the mark
            continue
        api = batchapi.batch_api(app, await rt.store.spec(spec_hash))
        try:
            await api.cancel(batch_id)
        except HerdError as exc:
            log.warning("batch %s: cancelling provider batch %s failed: %s", batch, batch_id, exc)
            failed.append({"provider_batch": batch_id, "error": str(exc)})
            continue
        asked.append(batch_id)
    ((items,),) = await rt.store.execute(
        "SELECT count(*) FROM herd_eval_items WHERE batch = %s AND status = 'cancelled'",
        (batch,),
    )
    return {"batch": batch, "cancelled_items": int(items), "provider_batches": asked,
            "provider_cancel_failed": failed}  # fmt: skip
