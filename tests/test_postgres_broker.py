"""What only the PostgreSQL broker does: retention of succeeded jobs (Redis expires
a succeeded job's hash after the same ``finished_ttl``)."""

from __future__ import annotations

import psycopg

from herd.queue.base import Completion, Failure, JobStatus, NewJob
from herd.queue.postgres import PostgresBroker
from tests.helpers import eventually


async def test_succeeded_jobs_past_retention_are_purged_and_dead_ones_kept(clean_pg):
    broker = PostgresBroker(clean_pg, finished_ttl=3600)
    await broker.open()
    try:
        made = await broker.enqueue([NewJob(task="t", payload={"n": n}) for n in range(4)])
        ids = [m.job_id for m in made]
        leases = {lease.job_id: lease for lease in await broker.claim(["default"], "w", 4)}
        assert (
            await broker.complete_if_leased([Completion(leases[i], "ok") for i in ids[:3]])
            == [True] * 3
        )
        assert await broker.fail_if_leased(Failure(leases[ids[3]], "no", final=True)) == (
            JobStatus.DEAD
        )
        old, kept, later, dead = ids
        with psycopg.connect(clean_pg, autocommit=True) as conn:
            conn.execute(
                "UPDATE herd_jobs SET finished_at = now() - interval '2 hours' WHERE id = ANY(%s)",
                ([old, later, dead],),
            )
            conn.execute(
                "UPDATE herd_jobs SET finished_at = now() - interval '59 minutes' WHERE id = %s",
                (kept,),
            )
        assert await broker.purge_finished(batch=1) == 2  # batches until none is left
        assert await broker.get_job(old) is None and await broker.get_job(later) is None
        assert (await broker.get_job(kept)).status == JobStatus.SUCCEEDED
        assert (await broker.get_job(dead)).status == JobStatus.DEAD  # the DLQ is never purged
    finally:
        await broker.close()


async def test_workers_purge_without_being_asked(clean_pg):
    broker = PostgresBroker(clean_pg, finished_ttl=60)
    await broker.open()
    try:
        (made,) = await broker.enqueue([NewJob(task="t", payload={})])
        (lease,) = await broker.claim(["default"], "w", 1)
        assert await broker.complete_if_leased([Completion(lease, "ok")]) == [True]
        with psycopg.connect(clean_pg, autocommit=True) as conn:
            conn.execute("UPDATE herd_jobs SET finished_at = now() - interval '1 hour'")
    finally:
        await broker.close()
    # Another process's broker purges as part of claiming, in the background.
    other = PostgresBroker(clean_pg, finished_ttl=60)
    await other.open()
    try:
        assert await other.claim(["default"], "w2", 1) == []

        async def gone() -> bool:
            return await other.get_job(made.job_id) is None

        await eventually(gone)
    finally:
        await other.close()
