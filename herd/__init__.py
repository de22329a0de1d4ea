"""herd: a crash-safe queue with fenced leases and caches for expensive model work."""

from typing import TYPE_CHECKING, Any

from herd._version import __version__
from herd.app import App
from herd.config import Settings
from herd.context import JobContext
from herd.errors import (
    BrokerError,
    BrokerUnavailable,
    ConfigError,
    FallbackWarning,
    Fatal,
    HerdError,
    JobNotFound,
    LeaseLost,
    LockNotAcquired,
    NotJSONSerializable,
    Retry,
    Snooze,
    UnknownTask,
)
from herd.queue.base import DeadReason, EnqueueResult, Job, JobStatus, Lease, QueueStats
from herd.tasks import Backoff, Task
from herd.worker import Worker, WorkerStats

if TYPE_CHECKING:
    from herd.semantic import SemanticCache


def __getattr__(name: str) -> Any:
    # Imported on first use: it brings numpy, pgvector and the search client along.
    if name == "SemanticCache":
        from herd.semantic import SemanticCache

        return SemanticCache
    raise AttributeError(f"module 'herd' has no attribute {name!r}")


__all__ = [
    "App",
    "Backoff",
    "BrokerError",
    "BrokerUnavailable",
    "ConfigError",
    "DeadReason",
    "EnqueueResult",
    "FallbackWarning",
    "Fatal",
    "HerdError",
    "Job",
    "JobContext",
    "JobNotFound",
    "JobStatus",
    "Lease",
    "LeaseLost",
    "LockNotAcquired",
    "NotJSONSerializable",
    "QueueStats",
    "Retry",
    "SemanticCache",
    "Settings",
    "Snooze",
    "Task",
    "UnknownTask",
    "Worker",
    "WorkerStats",
    "__version__",
]
