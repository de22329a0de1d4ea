"""A periodic job's definition and its ticks, and the state a store keeps for it.

A schedule's ticks are instants: the times its cron expression matches in its time
zone (cronsim, Debian cron's rules, DST included), or the multiples of ``every``
seconds since the Unix epoch. The store keeps the last tick that was fired; a
tick is fired by advancing that key with a compare-and-set in the same
transaction (or Lua script) as the enqueue of its job, so however many workers
tick, each tick makes one job.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from herd.errors import InvalidInput

# Back-filled runs one firing may enqueue at most, whatever catch_up asks: a schedule
# of every second left alone for a day must not enqueue 86,400 jobs in one script.
MAX_CATCH_UP = 1000
MAX_EVERY = 366 * 86400.0


class Policy(enum.StrEnum):
    """What a firing does with the ticks missed while no worker ran."""

    SKIP = "skip"  # run the latest tick only
    CATCH_UP = "catch_up"  # run the missed ticks too, the newest ``catch_up`` of them


def policy_of(value: Policy | str) -> Policy:
    try:
        return Policy(value)
    except ValueError:
        raise InvalidInput(
            f"a schedule's policy is skip or catch_up, not {value!r}", field="policy"
        ) from None


@dataclass(frozen=True)
class Schedule:
    """When a task runs by itself. ``cron`` (5 fields, in ``timezone``) or ``every``
    (seconds) gives the ticks; ``policy`` and ``catch_up`` say what a late firing runs."""

    name: str
    task: str
    queue: str = "default"
    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"
    policy: Policy = Policy.SKIP
    catch_up: int = 1  # most runs of one firing under Policy.CATCH_UP
    priority: int = 0

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise InvalidInput(
                f"schedule {self.name!r}: give cron or every, one of them", field="cron"
            )
        object.__setattr__(self, "policy", policy_of(self.policy))
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise InvalidInput(
                f"schedule {self.name!r}: unknown time zone {self.timezone!r}", field="timezone"
            ) from exc
        if self.cron is not None:
            try:
                CronSim(self.cron, datetime.now(UTC))
            except CronSimError as exc:
                raise InvalidInput(
                    f"schedule {self.name!r}: bad cron expression {self.cron!r} ({exc});"
                    " five fields: minute hour day month weekday",
                    field="cron",
                ) from exc
        if self.every is not None and not (
            isinstance(self.every, int | float) and 0 < self.every <= MAX_EVERY
        ):
            raise InvalidInput(
                f"schedule {self.name!r}: every must be 0 < seconds <= {MAX_EVERY:.0f}",
                field="every",
            )
        if isinstance(self.catch_up, bool) or not 1 <= self.catch_up <= MAX_CATCH_UP:
            raise InvalidInput(
                f"schedule {self.name!r}: catch_up must be 1 to {MAX_CATCH_UP}", field="catch_up"
            )

    @property
    def when(self) -> str:
        """The ticks, as a person reads them: the cron and its zone, or the interval."""
        if self.cron is not None:
            return f"{self.cron} ({self.timezone})"
        return f"every {self.every:g}s"

    def runs_per_firing(self) -> int:
        return self.catch_up if self.policy == Policy.CATCH_UP else 1

    def latest(self, at: datetime) -> datetime | None:
        """The last tick at or before ``at`` (None: none in cron's 50-year reach)."""
        ticks = self.due(None, at, 1)
        return ticks[0] if ticks else None

    def due(self, after: datetime | None, at: datetime, most: int) -> list[datetime]:
        """The ticks in (``after``, ``at``], oldest first, the newest ``most`` of them."""
        at = at.astimezone(UTC)
        if self.every is not None:
            step = self.every
            last = math.floor(at.timestamp() / step)
            first = last - most + 1
            if after is not None:
                first = max(first, math.floor(after.timestamp() / step) + 1)
            ticks = [datetime.fromtimestamp(k * step, UTC) for k in range(first, last + 1)]
            # A step like 0.1 divides a stored tick into k - 1e-9: never that tick again.
            return [t for t in ticks if after is None or t > after]
        assert self.cron is not None
        # cronsim steps strictly before its start: a second past ``at`` keeps ``at``
        # itself (cron ticks fall on whole minutes).
        start = (at + timedelta(seconds=1)).astimezone(ZoneInfo(self.timezone))
        out: list[datetime] = []
        for tick in CronSim(self.cron, start, reverse=True):
            tick = tick.astimezone(UTC)
            if len(out) >= most or (after is not None and tick <= after):
                break
            if tick <= at:
                out.append(tick)
        return out[::-1]

    def next_after(self, after: datetime) -> datetime | None:
        """The first tick strictly after ``after``."""
        after = after.astimezone(UTC)
        if self.every is not None:
            k = math.floor(after.timestamp() / self.every) + 1
            return datetime.fromtimestamp(k * self.every, UTC)
        assert self.cron is not None
        for tick in CronSim(self.cron, after.astimezone(ZoneInfo(self.timezone))):
            return tick.astimezone(UTC)
        return None


@dataclass(frozen=True)
class ScheduleState:
    """A schedule as its store keeps it: the definition the workers last registered,
    whether it is paused, and the last tick fired with the job it made."""

    schedule: Schedule
    paused: bool
    last_tick: datetime | None  # the newest tick fired (or skipped while paused)
    last_job_id: int | None  # the job of the last run (a tick's, or run-now's)
    last_run_at: datetime | None  # when that job was enqueued (store clock)
    runs: int  # jobs the schedule has made

    @property
    def name(self) -> str:
        return self.schedule.name

    def next_run(self) -> datetime | None:
        if self.last_tick is None:
            return None
        return self.schedule.next_after(self.last_tick)
