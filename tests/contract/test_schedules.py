"""Contract: periodic jobs (every backend). Each tick of a schedule makes its jobs once,
however many tickers race for it; skip and catch_up; pause, resume, run-now.

The tickers run on a clock the test moves (no sleeping): several Ticker objects on one
app stand for several workers, their steps run concurrently, so each reads the state
before any fires and only the store's compare-and-set keeps them from all firing.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from herd import App
from herd.schedule.ticker import Ticker

T0 = datetime(2026, 12, 3, 1, 0, 30, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def periodic_app(broker, **schedule) -> tuple[App, str, str]:
    """An app whose one task runs on ``schedule``, on a queue of its own (names are
    unique per test: the schedule table outlives a test on PostgreSQL)."""
    app = App(broker=broker)
    name, queue = f"tick-{uuid.uuid4().hex[:8]}", f"q-{uuid.uuid4().hex[:8]}"

    @app.periodic(queue=queue, name=name, **schedule)
    @app.task(name=f"{name}.task")
    def tick(payload):
        return payload

    return app, name, queue


async def ticks_enqueued(broker, queue: str) -> list[str]:
    jobs = await broker.list_jobs(queue=queue, limit=1000)
    return sorted(j.payload["tick"] for j in jobs)


async def step_all(tickers: list[Ticker]) -> int:
    results = await asyncio.gather(*(t.step() for t in tickers))
    return sum(len(f.job_ids) for fired, _ in results for f in fired)


async def test_several_tickers_make_exactly_one_job_per_tick(broker):
    app, name, queue = periodic_app(broker, every=60)
    clock = Clock()
    tickers = [Ticker(app, clock=clock) for _ in range(6)]
    for t in tickers:
        await t.register()
    made = 0
    for _ in range(12):
        clock.advance(60)
        # Three rounds per tick: late tickers, finding it fired, make nothing.
        for _ in range(3):
            made += await step_all(tickers)
    ticks = await ticks_enqueued(broker, queue)
    expected = [(datetime(2026, 12, 3, 1, 1, tzinfo=UTC) + timedelta(minutes=i)).isoformat()
                for i in range(12)]  # fmt: skip
    assert ticks == expected
    assert made == 12
    (state,) = await broker.schedules([name])
    assert state.runs == 12 and state.last_tick == datetime(2026, 12, 3, 1, 12, tzinfo=UTC)


async def test_a_new_schedule_waits_for_its_next_tick(broker):
    app, _, queue = periodic_app(broker, cron="0 2 * * *", timezone="Asia/Jakarta")
    clock = Clock(datetime(2026, 12, 3, 18, 59, 59, tzinfo=UTC))  # 01:59:59 in Jakarta
    ticker = Ticker(app, clock=clock)
    fired, wait = await ticker.step()
    assert fired == [] and wait == 1.0
    clock.advance(1)
    fired, wait = await ticker.step()
    assert [f.ticks for f in fired] == [[datetime(2026, 12, 3, 19, 0, tzinfo=UTC)]]
    assert wait == ticker.max_wait  # the next tick is a day away
    assert await ticks_enqueued(broker, queue) == ["2026-12-03T19:00:00+00:00"]


async def test_skip_runs_only_the_latest_of_the_missed_ticks(broker):
    app, name, queue = periodic_app(broker, every=10, policy="skip")
    clock = Clock()
    ticker = Ticker(app, clock=clock)
    await ticker.register()
    clock.advance(95)  # ticks 01:00:40 … 01:02:00 missed: nine
    await step_all([ticker, Ticker(app, clock=clock)])
    assert await ticks_enqueued(broker, queue) == ["2026-12-03T01:02:00+00:00"]
    clock.advance(10)
    await ticker.step()
    assert len(await ticks_enqueued(broker, queue)) == 2


async def test_catch_up_back_fills_the_newest_missed_ticks_up_to_its_bound(broker):
    app, name, queue = periodic_app(broker, every=10, policy="catch_up", catch_up=3)
    clock = Clock()
    tickers = [Ticker(app, clock=clock) for _ in range(3)]
    await tickers[0].register()
    clock.advance(95)
    assert await step_all(tickers) == 3
    assert await ticks_enqueued(broker, queue) == [
        "2026-12-03T01:01:40+00:00",
        "2026-12-03T01:01:50+00:00",
        "2026-12-03T01:02:00+00:00",
    ]
    clock.advance(20)  # two missed: both run
    assert await step_all(tickers) == 2
    (state,) = await broker.schedules([name])
    assert state.runs == 5
    jobs = await broker.get_jobs([state.last_job_id])
    assert jobs[0].payload == {"schedule": name, "tick": "2026-12-03T01:02:20+00:00"}


async def test_pause_fires_nothing_and_resume_drops_the_ticks_of_the_pause(broker):
    app, name, queue = periodic_app(broker, every=10, policy="catch_up", catch_up=100)
    clock = Clock()
    ticker = Ticker(app, clock=clock)
    await ticker.register()
    assert await broker.pause_schedule(name, True, None)
    clock.advance(60)
    assert await step_all([ticker]) == 0
    (state,) = await broker.schedules([name])
    assert state.paused
    latest = app.schedules[name].latest(clock())
    assert await broker.pause_schedule(name, False, latest)
    assert await step_all([ticker]) == 0  # the pause's six ticks are not back-filled
    clock.advance(10)
    assert await step_all([ticker]) == 1
    assert await ticks_enqueued(broker, queue) == ["2026-12-03T01:01:40+00:00"]
    assert not await broker.pause_schedule("no-such-schedule", True, None)


async def test_run_now_enqueues_one_job_and_moves_no_tick(broker):
    app, name, queue = periodic_app(broker, every=3600)
    clock = Clock()
    ticker = Ticker(app, clock=clock)
    await ticker.register()
    await broker.pause_schedule(name, True, None)
    (before,) = await broker.schedules([name])
    job = app._new_job(f"{name}.task", {"schedule": name, "tick": None}, queue=queue,
                       priority=None, dedup_key=None, delay=0.0)  # fmt: skip
    (result,) = await broker.fire_schedule(name, [job], after=None, tick=None)
    (after,) = await broker.schedules([name])
    assert after.last_job_id == result.job_id and after.runs == 1
    assert after.last_tick == before.last_tick and after.paused
    assert (await broker.get_job(result.job_id)).queue == queue
    assert await broker.fire_schedule("no-such-schedule", [job], after=None, tick=None) is None


async def test_a_removed_schedule_is_gone_until_a_ticker_registers_it_again(broker):
    app, name, queue = periodic_app(broker, every=10)
    clock = Clock()
    ticker = Ticker(app, clock=clock)
    await ticker.register()
    assert await broker.remove_schedule(name)
    assert await broker.schedules([name]) == []
    job = app._new_job(f"{name}.task", {"schedule": name, "tick": None}, queue=queue,
                       priority=None, dedup_key=None, delay=0.0)  # fmt: skip
    assert await broker.fire_schedule(name, [job], after=None, tick=None) is None
    assert not await broker.remove_schedule(name)
    # A worker of an app that still defines it puts it back at its next step.
    clock.advance(10)
    await ticker.step()
    assert [s.schedule.name for s in await broker.schedules([name])] == [name]


async def test_a_stale_compare_and_set_writes_nothing(broker):
    app, name, queue = periodic_app(broker, every=60)
    clock = Clock()
    ticker = Ticker(app, clock=clock)
    await ticker.register()
    (state,) = await broker.schedules([name])
    job = app._new_job(f"{name}.task", {}, queue=queue, priority=None, dedup_key=None, delay=0.0)
    tick = state.last_tick + timedelta(minutes=1)
    assert await broker.fire_schedule(name, [job], after=state.last_tick, tick=tick)
    # The same tick again, from the state read before: refused, nothing enqueued.
    assert await broker.fire_schedule(name, [job], after=state.last_tick, tick=tick) is None
    assert len(await broker.list_jobs(queue=queue)) == 1
