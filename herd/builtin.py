"""herd's built-in tasks, run by every `herd worker` (later: evaluation, embedding)."""

from __future__ import annotations

import hashlib

from herd.app import App
from herd.context import JobContext
from herd.errors import Retry
from herd.jsonvalue import JSON
from herd.llm.eval import batchapi, spec, stages, task
from herd.rag import ingest

tasks = App()

# Corpus indexing: one micro-batch of chunk ids per job; finalize retries until done.
tasks.task(name=ingest.EMBED_TASK, queue=ingest.QUEUE, lease_seconds=30, max_attempts=3)(
    ingest.embed_batch
)
tasks.task(name=ingest.FINALIZE_TASK, queue=ingest.QUEUE, lease_seconds=60, max_attempts=100_000)(
    ingest.finalize
)

# LLM evaluations: 30 s leases renewed while the provider call runs (30-120 s).
tasks.task(name=spec.TASK, queue=spec.QUEUE, lease_seconds=30, max_attempts=3)(task.evaluate)
# A pipeline's calls (herd.llm.eval.stages): one job per piece or per document's stage.
tasks.task(name=stages.STAGE_TASK, queue=spec.QUEUE, lease_seconds=30, max_attempts=3)(
    stages.run_stage
)
# Batch API: the submit job records its handle before anything leaves; the poll job
# hands itself back until the provider batch ends (many attempts: a snooze counts none).
tasks.task(name=spec.SUBMIT_TASK, queue=spec.QUEUE, lease_seconds=60, max_attempts=5)(
    batchapi.batch_submit
)
tasks.task(name=spec.POLL_TASK, queue=spec.QUEUE, lease_seconds=120, max_attempts=5)(
    batchapi.batch_poll
)


@tasks.task(name="herd.demo.fingerprint", lease_seconds=30)
def fingerprint(payload: JSON, ctx: JobContext) -> JSON:
    """The demo job: words, characters and SHA-256 of a text.

    ``flaky: true`` fails the first attempt, to show a retry in the demo.
    """
    text = str(payload["text"])
    if payload.get("flaky") and ctx.lease.attempts == 0:
        raise Retry("flaky demo job: failing its first attempt on purpose", after=0.5)
    return {
        "words": len(text.split()),
        "chars": len(text),
        "sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
        "worker": ctx.worker_id,
    }
