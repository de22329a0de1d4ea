"""Schedules' ticks: cron in a time zone (DST included), intervals, and bad input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from herd import App
from herd.errors import ConfigError, InvalidInput
from herd.schedule.model import Schedule


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_cron_ticks_are_read_in_the_schedules_time_zone():
    s = Schedule("nightly", "t", cron="0 2 * * *", timezone="Asia/Jakarta")  # UTC+7
    assert s.next_after(utc(2026, 12, 3, 12)) == utc(2026, 12, 3, 19)
    assert s.latest(utc(2026, 12, 3, 19)) == utc(2026, 12, 3, 19)  # at the tick: that tick
    assert s.latest(utc(2026, 12, 3, 18, 59, 59)) == utc(2026, 12, 2, 19)


def test_cron_across_a_dst_change_keeps_local_time():
    s = Schedule("berlin", "t", cron="30 1 * * *", timezone="Europe/Berlin")
    # 2026-03-29: clocks go from 02:00 to 03:00; 01:30 is CET (UTC+1) before, CEST after.
    assert s.due(utc(2026, 3, 27, 12), utc(2026, 3, 30, 12), 10) == [
        utc(2026, 3, 28, 0, 30),
        utc(2026, 3, 29, 0, 30),
        utc(2026, 3, 29, 23, 30),
    ]


def test_due_keeps_the_newest_ticks_up_to_the_bound():
    s = Schedule("fast", "t", every=1)
    due = s.due(utc(2026, 1, 1), utc(2026, 1, 2), 3)  # 86,400 missed
    assert due == [utc(2026, 1, 1, 23, 59, 58), utc(2026, 1, 1, 23, 59, 59), utc(2026, 1, 2)]
    assert s.due(utc(2026, 1, 2), utc(2026, 1, 2, 0, 0, 0, 999), 3) == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cron": "0 2 * *"}, "cron"),
        ({"cron": "0 2 * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({}, "cron"),
        ({"cron": "* * * * *", "every": 5}, "cron"),
        ({"every": 0}, "every"),
        ({"every": 5, "policy": "sometimes"}, "policy"),
        ({"every": 5, "catch_up": 0}, "catch_up"),
    ],
)
def test_bad_definitions_are_refused_with_the_field_named(kwargs, field):
    with pytest.raises(InvalidInput) as exc:
        Schedule("s", "t", **kwargs)
    assert exc.value.field == field


def test_periodic_composes_with_task_and_registers_both():
    app = App(broker="postgres", database_url="postgresql://nowhere/x")

    @app.periodic(cron="0 2 * * *", timezone="Asia/Jakarta", queue="nightly")
    @app.task(name="reindex", priority=5)
    def reindex(payload):
        return payload

    assert app.tasks["reindex"] is reindex
    s = app.schedules["reindex"]
    assert (s.task, s.queue, s.priority, s.cron) == ("reindex", "nightly", 5, "0 2 * * *")
    with pytest.raises(ConfigError):
        app.periodic(every=5, name="reindex")(reindex)


def test_a_fractional_interval_never_gives_the_stored_tick_again():
    s = Schedule("tenth", "t", every=0.1)
    after = utc(2026, 1, 1)
    for _ in range(200):
        (nxt,) = s.due(after, after + timedelta(seconds=0.101), 5)
        assert nxt > after
        after = nxt
    assert s.due(after, after, 5) == []
