"""herd's built-in tasks, run by every `herd worker`: each feature's, and the demo's."""

from __future__ import annotations

import hashlib

from herd.app import App
from herd.context import JobContext
from herd.errors import Retry
from herd.jsonvalue import JSON
from herd.llm.eval.builtin import tasks as eval_tasks
from herd.rag.builtin import tasks as rag_tasks

# Each feature declares its own tasks beside its code; a worker runs them all.
tasks = App()
tasks.include(rag_tasks)
tasks.include(eval_tasks)


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
