"""The worker app of the batched pipeline's kill test: batch_crash's (providers whose
Batch API client dies at HERD_TEST_CRASH_AT), with the pipeline's Batch API tasks on
leases of a few seconds, so that a killed worker's job is taken over within the test."""

from __future__ import annotations

import dataclasses

from herd.builtin import tasks as builtin_tasks
from herd.llm.eval.spec import POLL_TASK, SUBMIT_TASK
from herd.llm.eval.stages import GATHER_TASK, STAGE_TASK
from tests.apps.batch_crash import app

for _name in (SUBMIT_TASK, POLL_TASK, GATHER_TASK, STAGE_TASK):
    builtin_tasks.tasks[_name] = dataclasses.replace(builtin_tasks.tasks[_name], lease_seconds=3.0)

__all__ = ["app"]
