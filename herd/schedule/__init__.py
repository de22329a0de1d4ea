"""Periodic jobs: schedules (herd.schedule.model), the ticker every worker runs
(herd.schedule.ticker), and `herd schedule …` (herd.schedule.cli)."""

from herd.schedule.model import Policy, Schedule, ScheduleState

__all__ = ["Policy", "Schedule", "ScheduleState"]
