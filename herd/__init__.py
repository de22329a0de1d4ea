"""herd: a crash-safe queue with fenced leases and caches for expensive model work."""

from herd.app import App
from herd.config import Settings
from herd.errors import (
    BrokerError,
    BrokerUnavailable,
    ConfigError,
    Fatal,
    HerdError,
    JobNotFound,
    LeaseLost,
    LockNotAcquired,
    NotJSONSerializable,
    Retry,
    UnknownTask,
)
from herd.queue.base import DeadReason, EnqueueResult, Job, JobStatus, Lease, QueueStats
from herd.tasks import Backoff, JobContext, Task
from herd.worker import Worker, WorkerStats

__all__ = [
    "App",
    "Backoff",
    "BrokerError",
    "BrokerUnavailable",
    "ConfigError",
    "DeadReason",
    "EnqueueResult",
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
    "Settings",
    "Task",
    "UnknownTask",
    "Worker",
    "WorkerStats",
]
