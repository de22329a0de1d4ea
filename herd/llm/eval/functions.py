"""A pipeline's function stages: a Python function in place of a model call, found by
the name of a task registered with ``@app.task`` (by default ``module.fn``) or, failing
that, imported as ``module.fn`` (the current folder importable, as for a worker's
``--app``). Checked at submission (every function found) and run by the stage's job:
no ledger row, no budget, no limits; cached like a call, by the task's name, its
``version`` and what it reads."""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from herd.app import App
from herd.errors import InvalidInput
from herd.jsonvalue import JSON, canonical
from herd.llm.eval.pipeline import FunctionStage, Pipeline
from herd.tasks import Task

# The pieces' spec column of a function stage: no EvalSpec, its name and version.
SPEC_PREFIX = "function:"


class FunctionNotFound(InvalidInput):
    """A function stage names no task of the app and nothing importable."""


def spec_of(step: FunctionStage) -> str:
    return f"{SPEC_PREFIX}{step.task}@{step.version}"


def key_of(step: FunctionStage, text: str) -> str:
    """The cache key of the function over one input: never a model call's key."""
    read = hashlib.sha256(text.encode()).hexdigest()
    return hashlib.sha256(
        canonical(["function", step.task, step.version, read]).encode()
    ).hexdigest()


def resolve(app: App, name: str) -> Callable[..., Any]:
    """The function a stage names: the app's task of that name, else ``module.fn``
    imported (a Task there: its function). FunctionNotFound says why not."""
    task = app.tasks.get(name)
    if task is not None:
        return task.fn
    module_name, sep, attr = name.replace(":", ".").rpartition(".")
    if not sep or not module_name:
        raise FunctionNotFound(f"{name!r} is no task of the app and not module.fn")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # the current folder importable, as for --app
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise FunctionNotFound(f"{name!r}: no task of that name, and {exc}") from None
    found = getattr(module, attr, None)
    if isinstance(found, Task):
        return found.fn
    if not callable(found):
        raise FunctionNotFound(f"{name!r}: module {module_name!r} has no function {attr!r}")
    return found  # type: ignore[no-any-return]


def check(app: App, pipe: Pipeline) -> None:
    """Every function stage's function found, before anything is stored: InvalidInput,
    one line, naming the stage."""
    for step in pipe.steps:
        if isinstance(step, FunctionStage):
            try:
                resolve(app, step.task)
            except FunctionNotFound as exc:
                raise InvalidInput(f"stage {step.name!r}: {exc}", field="pipeline") from None


async def call(fn: Callable[..., Any], value: JSON) -> JSON:
    """``fn(value)``: awaited if async, in a thread if not (the worker's loop keeps
    renewing leases); its answer must be JSON."""
    if inspect.iscoroutinefunction(fn):
        answer = await fn(value)
    else:
        answer = await asyncio.to_thread(fn, value)
    canonical(answer)  # NotJSONSerializable: the stage's piece fails, naming why
    return answer
