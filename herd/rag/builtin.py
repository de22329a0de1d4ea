"""Corpus indexing's built-in tasks, as a worker runs them: name, queue, lease, attempts.

`herd worker` gathers them with every feature's (herd.builtin); `herd ingest` runs
them itself, on the indexing queue, without loading the other features.
"""

from __future__ import annotations

from herd.app import App
from herd.rag import ingest

tasks = App()

# One micro-batch of chunk ids per job; finalize retries until done.
tasks.task(name=ingest.EMBED_TASK, queue=ingest.QUEUE, lease_seconds=30, max_attempts=3)(
    ingest.embed_batch
)
tasks.task(name=ingest.FINALIZE_TASK, queue=ingest.QUEUE, lease_seconds=60, max_attempts=100_000)(
    ingest.finalize
)
