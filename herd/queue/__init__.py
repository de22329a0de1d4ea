"""Job stores behind one protocol (base.Broker): PostgreSQL now, Redis next."""

from herd.queue.base import Broker, Completion, Failure, Job, JobStatus, Lease, NewJob

__all__ = ["Broker", "Completion", "Failure", "Job", "JobStatus", "Lease", "NewJob"]
