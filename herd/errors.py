"""Every exception herd raises, named for the fact it reports.

A class's docstring is its default message (the Procrastinate habit), so
``raise LeaseLost()`` already says something useful. Errors of the drivers
(psycopg, redis) are translated into these at the backend boundary and never
reach a user untranslated.
"""

from __future__ import annotations


class HerdError(Exception):
    """herd failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip().splitlines()[0])


class ConfigError(HerdError):
    """The configuration is invalid."""


class NotJSONSerializable(HerdError):
    """The value is not JSON: payloads and results must be JSON objects, lists or scalars."""


class InvalidInput(NotJSONSerializable):
    """A value given to herd is refused; the message names the field and the limit."""

    def __init__(self, message: str | None = None, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class UnknownTask(HerdError):
    """No task with that name is registered."""


class JobNotFound(HerdError):
    """No job has that id."""


class BatchNotFound(HerdError):
    """No evaluation batch has that name."""


class ScheduleNotFound(HerdError):
    """No schedule has that name (a worker of the app that defines it registers it)."""


class NotBatchOwner(HerdError):
    """A caller may not change (or read) a batch another caller made (HTTP 403)."""


class BatchNameTaken(HerdError):
    """A submission under a batch name another caller made (HTTP 409)."""


class NotDeadLettered(HerdError):
    """The job is not in the dead-letter queue."""


class BrokerError(HerdError):
    """The job store failed."""


class BrokerUnavailable(BrokerError):
    """The job store cannot be reached; check that the server runs and the URL is right."""


class DedupKeyHeld(BrokerError):
    """Cannot requeue: an active job already holds the same dedup key."""


class MigrationError(BrokerError):
    """The schema could not be brought up to date."""


class EmbeddedServerError(HerdError):
    """The embedded PostgreSQL server could not be started."""


class LeaseLost(HerdError):
    """The lease on this job was lost (expired or taken over); the write was refused."""

    def __init__(self, message: str | None = None, *, job_id: int | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id


class Retry(HerdError):  # noqa: N818 - raised by task code to ask for a retry, like Celery's
    """The task asked to be retried."""

    def __init__(self, message: str | None = None, *, after: float | None = None) -> None:
        super().__init__(message)
        self.after = after


class Snooze(HerdError):  # noqa: N818 - raised by task code, like River's JobSnooze
    """The task asked to run again later; no attempt is counted."""

    def __init__(self, message: str | None = None, *, after: float) -> None:
        super().__init__(message)
        if not after >= 0 or after == float("inf"):
            raise ValueError(
                f"Snooze(after=...) must be a finite number of seconds >= 0, not {after!r}"
            )
        self.after = float(after)


class Fatal(HerdError):  # noqa: N818 - raised by task code to skip the remaining attempts
    """The task failed in a way that retrying cannot fix."""


class LockNotAcquired(HerdError):
    """The lock is held by someone else and was not released in time."""

    def __init__(self, message: str | None = None, *, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name


class SingleflightTimeout(HerdError):
    """Another caller is computing this value and did not finish within the wait."""


class CapacityTimeout(HerdError):
    """A provider limit had no capacity within the wait; nothing was taken."""

    def __init__(
        self, message: str | None = None, *, scope: str, reason: str, retry_in: float
    ) -> None:
        super().__init__(message)
        self.scope, self.reason, self.retry_in = scope, reason, retry_in


class FallbackWarning(RuntimeWarning):
    """herd runs a slower fallback: something its fast path needs is missing or failed.

    Also logged as an error. The test suite turns it into an error, so that a fallback
    never hides a missing dependency; ``-W error::herd.FallbackWarning`` does the same
    for an application's own tests.
    """
