"""The app run by the crash test's worker processes.

Each job sleeps, then (on PostgreSQL) upserts its result row keyed by job id
inside a fenced transaction: the write lands only while the worker still holds
the lease, so the row's token must equal the job's final token. On Redis the
fenced write is the completion itself.
"""

from __future__ import annotations

import asyncio
import os

from herd import App, JobContext

app = App()

SCHEMA = """
CREATE TABLE IF NOT EXISTS crash_effects (
    job_id bigint PRIMARY KEY, token bigint NOT NULL, pid integer NOT NULL, writes integer NOT NULL
)
"""


@app.task(name="crash.sleep", lease_seconds=1.5, max_stalls=5)
async def sleep_then_write(payload: dict, ctx: JobContext) -> dict:
    await asyncio.sleep(payload["seconds"])
    if ctx.app.broker.name == "postgres":
        async with ctx.fenced_transaction() as conn:
            await conn.execute(
                "INSERT INTO crash_effects (job_id, token, pid, writes) VALUES (%s, %s, %s, 1)"
                " ON CONFLICT (job_id) DO UPDATE SET token = excluded.token, pid = excluded.pid,"
                " writes = crash_effects.writes + 1",
                (ctx.job_id, ctx.lease.token, os.getpid()),
            )
    return {"pid": os.getpid(), "token": ctx.lease.token}
