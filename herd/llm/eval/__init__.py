"""LLM evaluations: a batch of documents, each answered once, every token accounted for.

The modules depend one way, each on those before it:

* ``spec``: what an evaluation is (EvalSpec, task names) and every check of an input or
  an answer; no I/O.
* ``ledger`` and ``store``: every statement on the ``herd_eval_*`` tables (named in
  ``queries.sql``).
* ``runtime``: a process's store, cache, prices, limiter and provider clients (from
  herd.llm.providers.registry).
* ``task`` and ``batchapi``: the jobs (herd.eval; herd.eval.batch_submit/poll).
* ``control`` and ``status``: budget, resume, cancel; settle, status, the list.
* ``submit``: one submission, checked once, stored, enqueued; ``results``: read back.

The CLI (herd.llm.cli), the HTTP API (herd.api.evals) and Python callers use these.
"""

from herd.llm.eval.control import cancel, resume, set_budget
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.spec import LOCAL, QUEUE, TASK, Caller, EvalSpec, validate_answer
from herd.llm.eval.status import BatchStatus, batch_status, list_batches, settle
from herd.llm.eval.store import EvalStore
from herd.llm.eval.submit import (
    SubmitReport,
    check_submission,
    enqueue_batch_documents,
    enqueue_documents,
    submit,
    submit_texts,
)

__all__ = [
    "LOCAL",
    "QUEUE",
    "TASK",
    "BatchStatus",
    "Caller",
    "EvalRuntime",
    "EvalSpec",
    "EvalStore",
    "SubmitReport",
    "batch_status",
    "cancel",
    "check_submission",
    "enqueue_batch_documents",
    "enqueue_documents",
    "list_batches",
    "resume",
    "set_budget",
    "settle",
    "submit",
    "submit_texts",
    "validate_answer",
]
