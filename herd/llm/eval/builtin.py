"""The evaluation's built-in tasks, as a worker runs them: name, queue, lease, attempts.

`herd worker` gathers them with every feature's (herd.builtin); `herd eval submit
--wait` runs them itself, on the evaluation's queue, without loading the other features.
"""

from __future__ import annotations

from herd.app import App
from herd.llm.eval import batchapi, pipebatch, spec, stages, task

tasks = App()

# LLM evaluations: 30 s leases renewed while the provider call runs (30-120 s).
tasks.task(name=spec.TASK, queue=spec.QUEUE, lease_seconds=30, max_attempts=3)(task.evaluate)
# A pipeline's calls (herd.llm.eval.stages): one job per piece or per document's stage.
tasks.task(name=stages.STAGE_TASK, queue=spec.QUEUE, lease_seconds=30, max_attempts=3)(
    stages.run_stage
)
# A pipeline's stage through the Batch API: its pieces gathered into provider batches.
tasks.task(name=stages.GATHER_TASK, queue=spec.QUEUE, lease_seconds=60, max_attempts=5)(
    pipebatch.gather_task
)
# Batch API: the submit job records its handle before anything leaves; the poll job
# hands itself back until the provider batch ends (many attempts: a snooze counts none).
tasks.task(name=spec.SUBMIT_TASK, queue=spec.QUEUE, lease_seconds=60, max_attempts=5)(
    batchapi.batch_submit
)
tasks.task(name=spec.POLL_TASK, queue=spec.QUEUE, lease_seconds=120, max_attempts=5)(
    batchapi.batch_poll
)
