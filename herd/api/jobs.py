"""Jobs: enqueue, look up, list by status and queue; the dead-letter queue; statistics."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response, status

from herd.api import overview
from herd.api.deps import HerdApp
from herd.api.models import (
    EnqueueIn,
    EnqueueOut,
    JobOut,
    JobSummaryOut,
    KeyStatsOut,
    OverviewOut,
    PurgeDeadIn,
    PurgeDeadOut,
    QueueName,
    RequeueIn,
    RequeueOut,
    SkippedOut,
    StatsOut,
)
from herd.errors import InvalidInput
from herd.queue.base import JobStatus
from herd.tasks import INTERNAL_PREFIX, is_internal

router = APIRouter(tags=["jobs"])

Limit = Annotated[int, Query(ge=1, le=1000)]


@router.post("/jobs", status_code=status.HTTP_201_CREATED, responses={200: {"model": EnqueueOut}})
async def enqueue(body: EnqueueIn, app: HerdApp, response: Response) -> EnqueueOut:
    """Add one job; 200 instead of 201 when an active job already holds its dedup key.

    herd's own tasks (``herd.…``) are refused: their endpoints make their payloads. A
    server given an app with tasks refuses the names that app does not register."""
    if is_internal(body.task):
        raise InvalidInput(
            f"task {body.task!r} is internal to herd (the {INTERNAL_PREFIX}* names); use its"
            " own endpoint (POST /evals) or command (herd ingest)",
            field="task",
        )
    if app.tasks and body.task not in app.tasks:
        raise InvalidInput(
            f"unknown task {body.task!r}: this server's app registers no task by that name",
            field="task",
        )
    result = await app.enqueue(
        body.task,
        body.payload,
        queue=body.queue,
        priority=body.priority,
        dedup_key=body.dedup_key,
        delay=body.delay,
        concurrency_key=body.concurrency_key,
        max_running_per_key=body.max_running_per_key,
    )
    if not result.created:
        response.status_code = status.HTTP_200_OK
    return EnqueueOut(job_id=result.job_id, created=result.created)


JobId = Annotated[int, Path(ge=1, le=2**63 - 1)]


@router.get("/jobs/{job_id}", responses={404: {"description": "no such job"}})
async def get_job(job_id: JobId, app: HerdApp) -> JobOut:
    return JobOut.of(await app.get_job(job_id))


@router.get("/jobs")
async def list_jobs(
    app: HerdApp,
    status: JobStatus | None = None,
    queue: Annotated[QueueName | None, Query()] = None,
    limit: Limit = 100,
) -> list[JobSummaryOut]:
    """Recent jobs, newest first; payloads and results as excerpts (whole: GET /jobs/{id})."""
    jobs = await app.list_jobs(status=status, queue=queue, limit=limit)
    return [JobSummaryOut.of(j) for j in jobs]


@router.get("/dlq", tags=["dead letters"])
async def dead_letters(
    app: HerdApp, queue: Annotated[QueueName | None, Query()] = None, limit: Limit = 100
) -> list[JobSummaryOut]:
    """Dead-lettered jobs, newest first, with their reasons and last errors."""
    return [JobSummaryOut.of(j) for j in await app.dead_letters(queue=queue, limit=limit)]


@router.post("/dlq/requeue", tags=["dead letters"])
async def requeue(body: RequeueIn, app: HerdApp) -> RequeueOut:
    """Send dead-lettered jobs back to their queues with fresh counters; a job whose
    dedup key an active job holds stays dead and is listed in ``skipped``."""
    result = await app.requeue(None if body.all else body.job_ids)
    skipped = [SkippedOut(**dataclasses.asdict(c)) for c in result.skipped]
    missing = sorted(set(body.job_ids or []) - set(result.requeued) - {c.job_id for c in skipped})
    return RequeueOut(requeued=result.requeued, missing=missing, skipped=skipped)


@router.post("/dlq/purge", tags=["dead letters"])
async def purge_dead(body: PurgeDeadIn, app: HerdApp) -> PurgeDeadOut:
    """Delete dead-lettered jobs (of ``queue``, or of every queue) dead-lettered more than
    ``older_than`` seconds ago; nothing else removes them."""
    return PurgeDeadOut(purged=await app.purge_dead(body.older_than, body.queue))


@router.get("/stats", tags=["statistics"])
async def stats(app: HerdApp) -> StatsOut:
    """Jobs per queue and status; cache counters and hit rates."""
    return StatsOut(queues=await app.stats(), caches=await overview.caches(app))


@router.get("/stats/keys", tags=["statistics"])
async def key_stats(app: HerdApp, limit: Limit = 20) -> KeyStatsOut:
    """Running and waiting jobs of the ``limit`` busiest concurrency keys; the cost
    follows the keys with work, not the jobs (counters kept as jobs change)."""
    return KeyStatsOut(keys=await app.key_stats(limit))


@router.get("/overview", tags=["statistics"])
async def get_overview(
    app: HerdApp,
    minutes: Annotated[int, Query(ge=1, le=120)] = 30,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> OverviewOut:
    """Everything the dashboard shows: queues, running jobs, throughput, dead letters,
    caches and the cost ledger."""
    return await overview.overview(app, minutes=minutes, limit=limit)
