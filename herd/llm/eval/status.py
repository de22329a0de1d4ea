"""Where a batch stands: its items settled against their jobs, counted, priced and
explained (why it waits, what to run next), and the list of batches."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from herd.app import App
from herd.errors import BatchNotFound
from herd.limits import batch_scope
from herd.llm.eval import batchapi
from herd.llm.eval.ledger import ESTIMATED
from herd.llm.eval.money import as_float
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.spec import BATCH_API_TASKS, QUEUE, TASK, own_limits
from herd.llm.eval.stageview import (
    failed_documents,
    running_documents,
    settle_pieces,
    stage_models,
    stage_progress,
)
from herd.queue.base import Job, JobStatus

FAILURES_SHOWN = 50
GONE = "its job no longer exists; submit it again"
# Leased jobs read for the running count: the fleet's active work, whatever the backlog.
RUNNING_READ = 10_000
# Waiting items whose jobs one status read may look at (herd.llm.eval.status.sweep).
SWEEP = 200


def next_step(batch: str, parked: str | None) -> str | None:
    """The command that gets a parked batch going again."""
    if parked == "budget":
        return f"herd eval budget {batch} USD"
    if parked == "refused":
        return f"herd eval resume {batch}"
    return None


@dataclass
class Settled:
    """A batch's waiting items by the state of their jobs."""

    running: int = 0
    dead: int = 0
    lost: int = 0  # their job is gone (purged, or its store lost it)
    # Parked items counted above (dead, lost or running): not among those parked waiting.
    parked_counted: int = 0
    failures: list[dict[str, Any]] = field(default_factory=list)  # path, job, error


@dataclass
class BatchStatus:
    batch: str | None
    documents: int = 0
    done: int = 0
    dead: int = 0
    running: int = 0
    queued: int = 0  # waiting for a worker (neither running, dead, parked nor cancelled)
    parked_items: int = 0
    cancelled_items: int = 0
    lost: int = 0
    created_at: datetime | None = None
    budget: float | None = None
    spent: float | None = None
    reserved: float | None = None
    # Calls cut off mid-call (cut short, lost, failed after sending): charged at their
    # worst case, since the provider's bill for them never came back.
    estimated: float | None = None
    unpriced: list[str] = field(default_factory=list)  # models without a price
    parked: str | None = None  # budget, refused or cancelled
    parked_reason: str | None = None
    next: str | None = None  # the command that gets it going again
    rate: float | None = None  # documents answered per second, over the last minute
    eta: float | None = None  # seconds until the rest is answered at that rate
    limits: dict[str, int] = field(default_factory=dict)
    # Its weight in the fair share of the fleet's limits, and the part of a fleet limit's
    # recent use it is getting now (None: not among the batches using one now).
    weight: int = 1
    share: float | None = None
    fair_share: float | None = None  # what its weight entitles it to, beside those batches
    limit_usage: list[dict[str, Any]] = field(default_factory=list)
    # The calls each key paid for and their cost: {key (its variable, else its id),
    # key_id, calls, cost}; more than one where a key pool spread them (HERD_LIMITS).
    keys: list[dict[str, Any]] = field(default_factory=list)
    waited_for_limits: float = 0.0
    ledger: dict[str, dict[str, Any]] = field(default_factory=dict)
    provider_cache: dict[str, Any] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    # A batch in stages: each stage's progress and cost (herd.llm.eval.stageview).
    stages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> int:  # the name of earlier versions
        return self.dead + self.lost

    @property
    def finished(self) -> bool:
        """Every document answered, dead or cancelled: nothing left to wait for."""
        return self.done + self.dead + self.lost + self.cancelled_items >= self.documents

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["failed"] = self.failed
        out["created_at"] = self.created_at.isoformat() if self.created_at else None
        return out


async def jobs_of(app: App, ids: list[int]) -> list[Job]:
    """The jobs ``ids``, one round trip per thousand."""
    jobs: list[Job] = []
    for start in range(0, len(ids), 1000):
        jobs += await app.broker.get_jobs(ids[start : start + 1000])
    return jobs


def _serves(job: Job, key: str) -> bool:
    """Whether ``job`` is the one an item of ``key`` waits on: a job id reused after the
    job store lost data names another key."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    if job.task in BATCH_API_TASKS:
        return key in (payload.get("keys") or [])
    return job.task != TASK or payload.get("key") == key


async def item_counts(rt: EvalRuntime, batch: str | None) -> dict[tuple[str, bool], int]:
    """The batch's items (all batches: None) by (status, in stages), from the counters."""
    rows = await rt.store.execute("item_counts", {"b": batch})
    return {(str(status), bool(staged)): int(n) for status, staged, n in rows}


async def settle(app: App, batch: str | None) -> Settled:
    """Count a batch's waiting items (all batches: None) by their job's state, at a cost
    of O(active work): never a fetch of every waiting item's job.

    Running: the broker's leased jobs, and the batch's items waiting on them. Dead and
    lost: the items recorded as such (herd_eval_failures), by their task on its last
    attempt or by the sweep; the jobs of the FAILURES_SHOWN shown are fetched for their
    error. The sweep looks at the jobs of at most SWEEP items that wait with no such
    record, and only when it can matter: the batch's last ones, or nothing of the
    evaluation queue is ready to run (a job store that lost them all, a worker-less
    wait). It records the dead and gone, and settles an item whose job ended without
    it (one stored by hand, a Batch API item that joined a chunk as it finished).
    """
    rt = await EvalRuntime.of(app)
    out = Settled()
    leased = [r.id for r in await app.broker.running(RUNNING_READ)]
    on_leased = await rt.store.execute("items_on_jobs", {"b": batch, "jobs": leased})
    jobs = {j.id: j for j in await jobs_of(app, sorted({r[1] for r in on_leased}))}
    running: set[int] = set()
    for _path, job_id, key, item_status in on_leased:
        job = jobs.get(job_id)
        if job is not None and _serves(job, key) and job.status == JobStatus.PROCESSING:
            running.add(job_id)
            out.running += 1
            out.parked_counted += item_status == "parked"
    # A pipeline's documents run through their pieces' jobs, not one of their own.
    staged = await running_documents(rt, None if batch is None else [batch], leased)
    out.running += sum(staged.values())
    if await _sweep_due(app, rt, batch, out.running):
        await sweep(app, rt, batch, sorted(running))
    params = {"b": batch, "running": sorted(running)}
    for kind, n, parked in await rt.store.execute("failure_counts", params):
        setattr(out, kind, int(n))
        out.parked_counted += int(parked)
    shown = await rt.store.execute("failures_shown", {**params, "limit": FAILURES_SHOWN})
    jobs = {j.id: j for j in await jobs_of(app, sorted({r[2] for r in shown}))}
    for item_batch, path, job_id, kind, key in shown:
        job = jobs.get(job_id)
        if kind == "lost":
            out.failures.append({"path": path, "job": job_id, "error": GONE})
        elif job is not None and _serves(job, key) and job.status == JobStatus.DEAD:
            error = job.last_error or job.dead_reason or "dead-lettered"
            out.failures.append({"path": path, "job": job_id, "error": error})
        else:  # requeued from the dead letters since (or gone): not dead now
            forget = {"b": item_batch, "path": path, "job": job_id}
            await rt.store.execute("forget_failure", forget)
            out.dead -= 1
    return out


async def _sweep_due(app: App, rt: EvalRuntime, batch: str | None, running: int) -> bool:
    """Whether the sweep can matter now: the batch's single-prompt items waiting with no
    failure recorded, not running, are SWEEP at most (its last ones), or no job of the
    evaluation queue is ready (nothing a worker would run can settle them)."""
    counts = await item_counts(rt, batch)
    waiting = counts.get(("queued", False), 0) + counts.get(("parked", False), 0)
    if waiting == 0:
        return False
    failed = await rt.store.execute("failure_counts", {"b": batch, "running": []})
    unswept = waiting - running - sum(int(n) for _, n, _ in failed)
    if unswept <= SWEEP:
        return unswept > 0
    ready = sum(s.ready for s in await app.broker.stats() if s.queue == QUEUE)
    return ready == 0


async def sweep(app: App, rt: EvalRuntime, batch: str | None, running: list[int]) -> None:
    """Look at the jobs of the batch's first SWEEP waiting items with no failure
    recorded: record the dead and gone; settle those whose job ended without them."""
    rows = await rt.store.execute("unswept", {"b": batch, "running": running, "limit": SWEEP})
    jobs = {j.id: j for j in await jobs_of(app, sorted({r[1] for r in rows}))}
    failed: list[tuple[str, str, int, str]] = []
    late: set[int] = set()
    for path, job_id, key, item_batch in rows:
        job = jobs.get(job_id)
        if job is None or not _serves(job, key):
            failed.append((item_batch, path, job_id, "lost"))
        elif job.status == JobStatus.DEAD:
            failed.append((item_batch, path, job_id, "dead"))
        elif job.status == JobStatus.SUCCEEDED and job.task in BATCH_API_TASKS:
            late.add(job_id)
        elif job.status == JobStatus.SUCCEEDED and isinstance(job.result, dict):
            await rt.store.execute(
                "settle_job",
                {"source": job.result.get("source"), "result": Jsonb(job.result), "job": job_id,
                 "key": key},
            )  # fmt: skip
    await rt.store.record_failures(failed)
    for job_id in sorted(late):
        await batchapi.settle_late(app, jobs[job_id])


def provider_cache(totals: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the provider's prompt cache served over the ledger's kinds, apart from herd's
    own cache: input tokens read from it, written to it, and the money saved (None: no
    priced call)."""
    saved = [t["provider_cache_saved"] for t in totals.values()]
    priced = [s for s in saved if s is not None]
    return {
        "cached_input_tokens": sum(t["cached_input_tokens"] for t in totals.values()),
        "cache_write_tokens": sum(t["cache_write_tokens"] for t in totals.values()),
        "saved": sum(priced) if priced else None,
    }


async def limit_usage(rt: EvalRuntime, batch: str | None) -> list[dict[str, Any]]:
    """The fleet-wide limits a batch's calls count against (all of them: None, those
    used in the last hour), with their use, waits and 429s. A limit is per provider,
    model and key: the batch's specs name the first two; every key's limit of those is
    shown, and the batch's own limits (scopes of their own, herd.limits.batch_scope)."""
    if rt.limiter is None:
        return []
    found = await rt.limiter.stats()
    now = time.time()
    if batch is not None:
        specs = (await models_of(rt, [batch])).get(batch, set())
        prefixes = tuple(f"{p}:{m}:" for p, m in specs)
        own = {batch_scope(batch, p, m) for p, m in specs}  # the batch's own limits
        found = [s for s in found if s.scope in own or (prefixes and s.scope.startswith(prefixes))]
    else:
        # A limit in use now (or paused): one batch's --rpm long done is not shown.
        found = [s for s in found if s.requests_now or s.in_flight or (s.paused_until or 0) > now]
    names = rt.limits_file.variables() if rt.limits_file else {}
    return [
        {
            "scope": s.scope,
            # The key the scope counts for, by its variable where HERD_LIMITS names it,
            # else its id (never the key); None for a batch's own limit.
            "key": _key_of(s.scope, names),
            "key_id": None if s.scope.startswith("batch:") else s.scope.rpartition(":")[2],
            "limit": s.limit.to_json(),
            "requests_now": round(s.requests_now, 2),
            "tokens_now": round(s.tokens_now, 2),
            "in_flight": s.in_flight,
            "requests": s.requests,
            "tokens": s.tokens,
            "waits": s.waits,
            "wait_seconds": round(s.wait_seconds, 3),
            "rate_limited": s.rate_limited,
            "paused_for": round(max(0.0, (s.paused_until or 0.0) - now), 3),
            # The batches using it now, with their weights and shares (herd.limits.Share).
            "shares": [
                {
                    "batch": f.flow,
                    "weight": f.weight,
                    "share": round(f.share, 3),
                    "fair": round(f.fair, 3),
                    "waiting": f.waiting,
                }
                for f in s.shares
            ],  # fmt: skip
        }
        for s in found
    ]


def _key_of(scope: str, names: dict[str, str]) -> str | None:
    if scope.startswith("batch:"):
        return None
    ident = scope.rpartition(":")[2]
    return names.get(ident, ident)


async def batch_status(app: App, batch: str | None) -> BatchStatus:
    """Progress of a batch (all: None), why it waits, and its cost ledger."""
    rt = await EvalRuntime.of(app)
    row = None
    if batch is not None:
        row = await rt.store.batch(batch)
        if row is None and not await rt.store.exists(batch):
            raise BatchNotFound(f"no batch named {batch!r}; `herd eval list` shows them")
    settled = await settle(app, batch)
    if batch is not None:  # a pipeline's pieces whose jobs died uncounted
        await settle_pieces(app, rt, batch)
    counts = await item_counts(rt, batch)
    documents = sum(counts.values())
    done, parked, cancelled = (
        sum(n for (status, _), n in counts.items() if status == want)
        for want in ("done", "parked", "cancelled")
    )
    # The ledger's summary (of the batch, or of all time), not its rows: it costs
    # O(kinds) and keeps the totals of rows past HERD_LEDGER_TTL.
    totals = await rt.store.totals(batch)
    usage = await limit_usage(rt, batch)
    if batch is not None:  # a pipeline's documents a stage failed count as dead
        failed, shown = await failed_documents(rt, batch)
        settled.dead += failed
        settled.failures = (shown + settled.failures)[:FAILURES_SHOWN]
    waiting = int(documents) - int(done) - int(cancelled) - settled.dead - settled.lost
    status = BatchStatus(
        batch=batch,
        documents=int(documents),
        done=int(done),
        dead=settled.dead,
        lost=settled.lost,
        running=settled.running,
        parked_items=int(parked) - settled.parked_counted,
        cancelled_items=int(cancelled),
        queued=max(0, waiting - settled.running - (int(parked) - settled.parked_counted)),
        ledger=totals,
        provider_cache=provider_cache(totals),
        limit_usage=usage,
        waited_for_limits=round(sum(u["wait_seconds"] for u in usage), 3),
        failures=settled.failures,
    )
    estimated = [t["cost"] for k, t in totals.items() if k in ESTIMATED and t["cost"]]
    status.estimated = sum(estimated) if estimated else None
    if row is not None and batch is not None:
        status.created_at = row["created_at"]
        status.budget, status.spent, status.reserved = row["budget"], row["spent"], row["reserved"]
        status.parked, status.parked_reason = row["parked"], row["parked_reason"]
        status.limits = row["limits"] or {}
        status.weight = own_limits(status.limits)[1]
        mine = [f for u in usage for f in u["shares"] if f["batch"] == batch]
        if mine:
            status.share, status.fair_share = mine[0]["share"], mine[0]["fair"]
        status.next = next_step(batch, row["parked"])
        status.stages = await stage_progress(rt, batch)
        names = rt.limits_file.variables() if rt.limits_file else {}
        status.keys = [
            {"key": names.get(kid, kid), "key_id": kid, "calls": int(n), "cost": as_float(c)}
            for kid, n, c in await rt.store.execute("batch_keys", {"b": batch})
        ]
        status.unpriced = (await unpriced(rt, [batch])).get(batch, [])
        ((recent, since_first, _),) = await rt.store.execute("recent_rate", {"b": batch})
        if recent:
            status.rate = round(int(recent) / min(60.0, max(1.0, float(since_first))), 3)
            status.eta = round(waiting / status.rate, 1) if status.rate else None
    return status


async def models_of(rt: EvalRuntime, batches: list[str]) -> dict[str, set[tuple[str, str]]]:
    """(provider, model) of each batch given: by the specs its items were sent with, and
    a pipeline's by its stages (its items hold no spec of one call)."""
    models = await stage_models(rt, batches)
    for batch, provider, model in await rt.store.execute("batch_specs", {"batches": batches}):
        models.setdefault(batch, set()).add((provider, model))
    return models


async def unpriced(rt: EvalRuntime, batches: list[str]) -> dict[str, list[str]]:
    """The models without a price of each batch given that has any."""
    out = {}
    for batch, found in (await models_of(rt, batches)).items():
        if missing := sorted({m for p, m in found if rt.prices.lookup(m, p) is None}):
            out[batch] = missing
    return out


async def list_batches(
    app: App, *, limit: int = 50, before: tuple[datetime, str] | None = None
) -> list[dict[str, Any]]:
    """A page of batches, newest first, each with its counts, whether it is parked, and
    its state: parked, done (nothing left to wait for), running (a job of it is leased
    now) or queued (waiting for a worker)."""
    rt = await EvalRuntime.of(app)
    rows = await rt.store.list_batches(limit=limit, before=before)
    names = [r[0] for r in rows]
    counts = await rt.store.item_counts(names)
    leased = [r.id for r in await app.broker.running(RUNNING_READ)]
    running = await running_documents(rt, names, leased)
    params = {"batches": names, "jobs": leased, "running": leased}
    for batch, n in await rt.store.execute("running_by_batch", params):
        running[batch] = running.get(batch, 0) + int(n)
    failed = {b: int(n) for b, n in await rt.store.execute("failed_by_batch", params)}
    no_price = await unpriced(rt, names)
    out = []
    for name, created, budget, spent, parked, reason in rows:
        documents, done, parked_items, cancelled = counts.get(name, (0, 0, 0, 0))
        dead, now = failed.get(name, 0), running.get(name, 0)
        finished = done + dead + cancelled >= documents
        state = ("cancelled" if parked == "cancelled" else "parked" if parked
                 else "done" if finished else "running" if now else "queued")  # fmt: skip
        out.append({"batch": name, "created_at": created.isoformat(), "documents": documents,
                    "done": done, "failed": dead, "running": now,
                    "parked_items": parked_items, "cancelled_items": cancelled,
                    "budget": budget, "spent": spent, "unpriced": no_price.get(name, []),
                    "parked": parked, "parked_reason": reason, "state": state,
                    "next": next_step(name, parked)})  # fmt: skip
    return out
