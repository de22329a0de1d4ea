"""Periodic jobs on Redis: the layout and the scripts' arguments.

    herd:{q}:sched:<name>  hash: the schedule's definition and state (paused, last_tick
                           in µs since the epoch, last_job_id, last_run_at in ms, runs),
                           in the slot of its queue, so that the tick's compare-and-set
                           and the enqueue of its jobs are one script (schedule_fire.lua
                           run after enqueue.lua) on Redis Cluster too
    herd:schedules         hash: schedule name -> its queue (for listing only)

A schedule moved to another queue starts afresh there (its old hash stays behind).
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

from herd.schedule.model import Policy, Schedule, ScheduleState

REGISTRY = "herd:schedules"


@cache
def fire_script(tp_keep: int) -> str:
    """enqueue.lua as a function, then the tick's compare-and-set around it."""
    folder = resources.files("herd.queue").joinpath("lua")

    def read(name: str) -> str:
        return folder.joinpath(name).read_text(encoding="utf-8")

    return (
        f"local TP_KEEP = {int(tp_keep)}\n"
        + read("common.lua")
        + "\nlocal function enqueue_jobs()\n"
        + read("enqueue.lua")
        + "\nend\n"
        + read("schedule_fire.lua")
    )


def micros(value: datetime | None) -> str:
    """A tick as the hash keeps it: integer µs, so that it compares exactly."""
    if value is None:
        return ""
    delta = value.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return str((delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds)


def from_micros(text: str | None) -> datetime | None:
    if not text:
        return None
    n = int(text)
    return datetime.fromtimestamp(n // 1_000_000, UTC).replace(microsecond=n % 1_000_000)


def save_args(schedule: Schedule, tick: datetime | None) -> list[Any]:
    s = schedule
    return [
        s.name,
        s.task,
        s.queue,
        s.cron or "",
        "" if s.every is None else repr(float(s.every)),
        s.timezone,
        s.policy.value,
        s.catch_up,
        s.priority,
        micros(tick),
    ]


def state(h: dict[str, str]) -> ScheduleState:
    schedule = Schedule(
        name=h["name"],
        task=h["task"],
        queue=h["queue"],
        cron=h.get("cron") or None,
        every=float(h["every"]) if h.get("every") else None,
        timezone=h["timezone"],
        policy=Policy(h["policy"]),
        catch_up=int(h["catch_up"]),
        priority=int(h.get("priority") or 0),
    )
    run_at = h.get("last_run_at")
    return ScheduleState(
        schedule=schedule,
        paused=h.get("paused") == "1",
        last_tick=from_micros(h.get("last_tick")),
        last_job_id=int(h["last_job_id"]) if h.get("last_job_id") else None,
        last_run_at=datetime.fromtimestamp(int(run_at) / 1000, UTC) if run_at else None,
        runs=int(h.get("runs") or 0),
    )
