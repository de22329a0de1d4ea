"""The app the chaos workers run (``python -m herd worker chaos.app:app``).

``chaos.work`` sleeps a while, calls the provider simulator once (tagged
``job:token:pid`` so that every call is attributed to one attempt), then writes
its result: on PostgreSQL an upsert into ``chaos_results`` plus one row in
``chaos_writes`` inside ``JobContext.fenced_transaction()`` (they land only
while the lease is held); on Redis the fenced write is the worker's completion
itself. ``chaos.poison`` always raises (it must end in the dead-letter queue).

``herd.eval`` is herd's own evaluation task, registered here again with the run's
short lease: a job's lease is set when it is enqueued, from the producer's
registry, so the evaluations the harness submits are taken over within the run.
The workers run the built-in registration (the same function). So does
``herd.eval.stage``, a pipeline's call (chaos/pipeline.py).

Every step is also appended, unfenced, to a side log of this process (one JSON
line per event, one ``os.write`` on an ``O_APPEND`` file: it survives SIGKILL
and no database fault touches it), so the checker can show that the writes the
fencing refused never landed.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import httpx

from herd import App, JobContext
from herd.errors import LeaseLost
from herd.llm import eval as evaluate
from herd.llm.eval import stages
from herd.tasks import Backoff

LEASE_SECONDS = float(os.environ.get("CHAOS_LEASE", "3.0"))

SCHEMA = """
CREATE TABLE IF NOT EXISTS chaos_results (
    job_id bigint PRIMARY KEY, token bigint NOT NULL, pid integer NOT NULL, writes integer NOT NULL
);
CREATE TABLE IF NOT EXISTS chaos_writes (
    id bigserial PRIMARY KEY, job_id bigint NOT NULL, token bigint NOT NULL,
    pid integer NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

app = App()

_client: httpx.AsyncClient | None = None
_side_fd: int | None = None


def side_log(event: str, ctx: JobContext, **extra: Any) -> None:
    """Append one event of this attempt to the process's side log (unfenced)."""
    global _side_fd
    if _side_fd is None:
        folder = Path(os.environ["CHAOS_DIR"])
        _side_fd = os.open(
            folder / f"side-{os.getpid()}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
        )
    record = {
        "t": time.time(),
        "event": event,
        "job": ctx.job_id,
        "token": ctx.lease.token,
        "pid": os.getpid(),
        **extra,
    }
    os.write(_side_fd, (json.dumps(record) + "\n").encode())


async def call_provider(ctx: JobContext) -> str:
    """One chat completion from the simulator, tagged with this attempt."""
    global _client
    if _client is None:
        _client = httpx.AsyncClient(base_url=os.environ["CHAOS_SIM_URL"], timeout=60.0)
    tag = f"{ctx.job_id}:{ctx.lease.token}:{os.getpid()}"
    response = await _client.post(
        "/v1/chat/completions",
        headers={"x-sim-tag": tag, "authorization": "Bearer sk-chaos"},
        json={"model": "sim-chaos", "messages": [{"role": "user", "content": f"job {tag}"}]},
    )
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


@app.task(
    name="chaos.work",
    lease_seconds=LEASE_SECONDS,
    max_attempts=10,
    max_stalls=10,
    backoff=Backoff(base=0.2, cap=2.0),
)
async def work(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    side_log("start", ctx, attempts=ctx.lease.attempts)
    if payload.get("flaky") and ctx.lease.attempts == 0:
        side_log("flaky", ctx)
        raise RuntimeError("flaky job: fails its first attempt (before any provider call)")
    await asyncio.sleep(float(payload["seconds"]))
    await ctx.check_lease()  # before the paid call: a worker resumed after SIGSTOP stops here
    side_log("call", ctx)
    answer = await call_provider(ctx)
    side_log("answered", ctx)
    # A job store with SQL of its own (PostgreSQL) fences the write with the lease; on
    # another (Redis) the job's fenced result is the only write the checker reads.
    fenced = ctx.app.broker.fenced_transaction(ctx.lease)
    if fenced is not None:
        try:
            async with fenced as conn:
                await conn.execute(
                    "INSERT INTO chaos_results (job_id, token, pid, writes) VALUES (%s, %s, %s, 1)"
                    " ON CONFLICT (job_id) DO UPDATE SET token = excluded.token,"
                    " pid = excluded.pid, writes = chaos_results.writes + 1",
                    (ctx.job_id, ctx.lease.token, os.getpid()),
                )
                await conn.execute(
                    "INSERT INTO chaos_writes (job_id, token, pid) VALUES (%s, %s, %s)",
                    (ctx.job_id, ctx.lease.token, os.getpid()),
                )
        except LeaseLost:
            side_log("refused", ctx)
            raise
        side_log("written", ctx)
    side_log("return", ctx)
    return {"token": ctx.lease.token, "pid": os.getpid(), "chars": len(answer)}


@app.task(name="chaos.poison", lease_seconds=LEASE_SECONDS, max_attempts=2,
          backoff=Backoff(base=0.2, cap=1.0))  # fmt: skip
async def poison(payload: dict[str, Any], ctx: JobContext) -> None:
    side_log("start", ctx, attempts=ctx.lease.attempts)
    raise ValueError("poison job: always fails (it must end in the dead-letter queue)")


app.task(name=evaluate.TASK, queue=evaluate.QUEUE, lease_seconds=LEASE_SECONDS, max_attempts=10,
         max_stalls=10, backoff=Backoff(base=0.2, cap=2.0))(evaluate.task.evaluate)  # fmt: skip
# The pipeline's calls (chaos/pipeline.py): the pieces the harness enqueues take this
# short lease; those a worker's fan-in enqueues take the built-in registration's.
app.task(name=stages.STAGE_TASK, queue=evaluate.QUEUE, lease_seconds=LEASE_SECONDS,
         max_attempts=10, max_stalls=10, backoff=Backoff(base=0.2, cap=2.0))(
    stages.run_stage)  # fmt: skip
