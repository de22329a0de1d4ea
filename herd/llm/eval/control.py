"""What a user does to a batch once submitted: set its budget, resume it, cancel it.

Cancelling keeps what has been paid for: answers already in the exact cache or
delivered by a provider batch before it stopped stay and are served. Everything else
stops: the batch is marked cancelled in the same transaction that marks its waiting
items 'cancelled', so no job of it opens a call afterwards (the budget's reservation
reads that mark), and no later submission adds to it; the jobs of those items are
brought forward to end now instead of waiting out a park; each provider batch it
submitted is cancelled at the provider here, and again by its poll job, which files
what the provider answered before it stopped.
"""

from __future__ import annotations

import logging
from typing import Any

from herd.app import App
from herd.errors import BatchNotFound, HerdError, NotBatchOwner
from herd.jsonvalue import check_text
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.spec import LOCAL, Caller, check_budget

log = logging.getLogger("herd.eval")


async def check_owner(rt: EvalRuntime, batch: str, caller: Caller) -> None:
    """BatchNotFound without such a batch; NotBatchOwner unless ``caller`` made it or is
    an admin. A batch's owner never changes once made, so checking before the change
    leaves no window."""
    owner = await rt.store.owner(batch)
    if owner is None:
        raise BatchNotFound(f"no batch named {batch!r}")
    if not caller.admin and owner != caller.owner:
        raise NotBatchOwner(
            f"batch {batch!r} was made by another caller: only it, or the admin token"
            " (HERD_API_TOKEN), may change or read it"
        )


async def set_budget(
    app: App, batch: str, budget: float | None, *, caller: Caller = LOCAL
) -> dict[str, Any]:
    """Raise or lower a batch's budget (None: no budget). A parked batch with room
    again resumes: its items are queued and its jobs due at once."""
    check_text(batch, "batch")
    budget = check_budget(budget)
    rt = await EvalRuntime.of(app)
    await check_owner(rt, batch, caller)
    found, ids = await rt.store.set_budget(batch, budget)
    if ids:
        await app.broker.reschedule(ids, 0)
        log.info("batch %s: budget raised, %d jobs resumed", batch, len(ids))
    return {**found, "resumed": len(ids)}


async def resume(app: App, batch: str, *, caller: Caller = LOCAL) -> dict[str, Any]:
    """Continue a batch parked because the provider refused its key or model (once
    fixed) or for its budget (as it stands: it parks again if there is still no room).
    BatchNotFound if there is no such batch."""
    check_text(batch, "batch")
    rt = await EvalRuntime.of(app)
    await check_owner(rt, batch, caller)
    ids = await rt.store.resume(batch)
    if ids:
        await app.broker.reschedule(ids, 0)
        log.info("batch %s resumed: %d jobs due now", batch, len(ids))
    found = await rt.store.batch(batch)
    assert found is not None
    return {"batch": batch, **found, "resumed": len(ids)}


async def cancel(app: App, batch: str, *, caller: Caller = LOCAL) -> dict[str, Any]:
    """Cancel ``batch`` (BatchNotFound if there is none). Returns the items cancelled,
    the provider batches asked to stop, and those whose cancel failed (their poll jobs
    ask again)."""
    rt = await EvalRuntime.of(app)
    await check_owner(rt, batch, caller)
    jobs, provider_batches = await rt.store.cancel(batch)
    if jobs:
        await app.broker.reschedule(jobs, 0)
    asked: list[str] = []
    failed: list[dict[str, str]] = []
    for _handle, spec_hash, batch_id, variable in provider_batches:
        if batch_id is None:  # being submitted: its submit job sees the mark
            continue
        api = rt.batch_api(await rt.store.spec(spec_hash), variable)
        try:
            await api.cancel(batch_id)
        except HerdError as exc:
            log.warning("batch %s: cancelling provider batch %s failed: %s", batch, batch_id, exc)
            failed.append({"provider_batch": batch_id, "error": str(exc)})
            continue
        asked.append(batch_id)
    return {"batch": batch, "cancelled_items": await rt.store.cancelled_items(batch),
            "provider_batches": asked, "provider_cancel_failed": failed}  # fmt: skip
