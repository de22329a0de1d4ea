"""Tasks: named functions a worker runs, with the policy for their jobs."""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from herd.queue.base import MAX_RUNNING_PER_KEY

TaskFunction = Callable[..., Any]

# herd's own tasks (herd.builtin) are named under this prefix; their payloads are made by
# herd's features (herd eval, herd ingest), so the generic POST /jobs refuses the prefix.
INTERNAL_PREFIX = "herd."


def is_internal(name: str) -> bool:
    return name.startswith(INTERNAL_PREFIX)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter: attempt n waits about base * 2**n, at most cap."""

    base: float = 1.0
    cap: float = 300.0

    def delay(self, attempts: int) -> float:
        ceiling = min(self.cap, self.base * 2.0 ** max(0, attempts - 1))
        # "Equal jitter": never zero (no hot retry loop), never in lockstep with peers.
        return ceiling / 2 + random.uniform(0, ceiling / 2)


@dataclass(frozen=True)
class Task:
    name: str
    fn: TaskFunction
    queue: str = "default"
    priority: int = 0
    lease_seconds: float = 30.0
    max_attempts: int = 3
    max_stalls: int = 3
    backoff: Backoff = field(default_factory=Backoff)
    # Jobs of one concurrency key that may run at once (those enqueued with a key).
    max_running_per_key: int = 1

    # Worked out once: inspect.signature on every job cost 7% of a no-op drain.
    is_async: bool = field(init=False, repr=False, compare=False)
    wants_context: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        if self.max_attempts < 1 or self.max_stalls < 1:
            raise ValueError("max_attempts and max_stalls must be at least 1")
        if not 1 <= self.max_running_per_key <= MAX_RUNNING_PER_KEY:
            raise ValueError(f"max_running_per_key must be 1 to {MAX_RUNNING_PER_KEY}")
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))
        object.__setattr__(self, "wants_context", "ctx" in inspect.signature(self.fn).parameters)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling a task runs its function directly, in the caller's process."""
        return self.fn(*args, **kwargs)


# What a producer names a task by: its name, or the Task itself.
TaskRef = str | Task


__all__ = ["INTERNAL_PREFIX", "Backoff", "Task", "TaskFunction", "TaskRef", "is_internal"]
