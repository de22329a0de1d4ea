"""The ticker every worker runs beside its claim loop: it fires the due ticks of its
app's schedules.

No leader: each worker reads its schedules' state when a tick falls due and fires
it through the store's compare-and-set (Broker.fire_schedule), which lets exactly
one of them enqueue the tick's jobs; the others find the last tick moved and do
nothing. A worker killed at any point leaves either the tick unfired (the next
worker's pass fires it, as a late tick) or fired with its jobs, never half.

The clock is injected: tests drive :meth:`Ticker.step` with a clock they move. The
default is this machine's wall clock: a skewed clock fires a tick early or late by
its skew, never twice (the store's key decides).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from herd.app import App
from herd.errors import HerdError
from herd.queue.base import NewJob
from herd.schedule.model import Schedule, ScheduleState

log = logging.getLogger("herd.schedule")

Clock = Callable[[], datetime]
# Longest sleep between two looks at the store, whatever the next tick: a resume, a
# schedule registered by another deploy, a clock that jumped are seen this late at most.
MAX_WAIT = 30.0


def wall_clock() -> datetime:
    return datetime.now(UTC)


def tick_payload(schedule: Schedule, tick: datetime | None) -> dict[str, str | None]:
    """What a periodic job receives: its schedule, and its tick in UTC ISO 8601
    (None for a run asked for by hand)."""
    return {"schedule": schedule.name, "tick": tick.isoformat() if tick else None}


def jobs_for(app: App, schedule: Schedule, ticks: list[datetime | None]) -> list[NewJob]:
    return [
        app._new_job(  # the producers' one gate: a schedule's jobs are checked as any other
            schedule.task,
            tick_payload(schedule, tick),
            queue=schedule.queue,
            priority=schedule.priority,
            dedup_key=None,
            delay=0.0,
        )
        for tick in ticks
    ]


@dataclass
class Fired:
    """One firing: the ticks a worker enqueued jobs for."""

    schedule: str
    ticks: list[datetime]
    job_ids: list[int]


class Ticker:
    def __init__(self, app: App, *, clock: Clock = wall_clock, max_wait: float = MAX_WAIT) -> None:
        self.app = app
        self.clock = clock
        self.max_wait = max_wait
        self._registered = False

    async def register(self) -> None:
        """Store the app's schedules; a new one starts at its latest tick (so its first
        run is its next tick, not one from the past)."""
        now = self.clock()
        items = [(s, s.latest(now)) for s in self.app.schedules.values()]
        await self.app.broker.save_schedules(items)
        self._registered = True

    async def step(self) -> tuple[list[Fired], float]:
        """Fire every due tick once (by this worker, or found fired by another); the
        firings this worker made and the seconds until the next tick."""
        if not self._registered:
            await self.register()
        schedules = self.app.schedules
        states = {s.name: s for s in await self.app.broker.schedules(list(schedules))}
        if len(states) < len(schedules):
            await self.register()  # removed from the store meanwhile: here again
            states = {s.name: s for s in await self.app.broker.schedules(list(schedules))}
        fired: list[Fired] = []
        now = self.clock()
        wait = self.max_wait
        for schedule in schedules.values():
            state = states.get(schedule.name)
            if state is None:
                continue
            if not state.paused:
                done = await self._fire(schedule, state, now)
                if done is not None:
                    fired.append(done)
            nxt = schedule.next_after(now)
            if nxt is not None:
                wait = min(wait, (nxt - now).total_seconds())
        return fired, max(0.0, wait)

    async def _fire(self, schedule: Schedule, state: ScheduleState, now: datetime) -> Fired | None:
        due = schedule.due(state.last_tick, now, schedule.runs_per_firing())
        if not due:
            return None
        jobs = jobs_for(self.app, schedule, list(due))
        results = await self.app.broker.fire_schedule(
            schedule.name, jobs, after=state.last_tick, tick=due[-1]
        )
        if results is None:
            return None  # another worker fired it first (or it was paused meanwhile)
        ids = [r.job_id for r in results]
        log.info(
            "schedule %s: tick %s fired, job %s%s",
            schedule.name,
            due[-1].isoformat(),
            ids[-1],
            f" (and {len(ids) - 1} missed ticks back-filled)" if len(ids) > 1 else "",
        )
        return Fired(schedule.name, due, ids)

    async def run(self, stop: asyncio.Event) -> None:
        """Fire ticks until ``stop`` is set; a store that fails is tried again later."""
        failures = 0
        while not stop.is_set():
            try:
                _, wait = await self.step()
                failures = 0
            except HerdError as exc:  # the store failing, or a job the producer gate refused
                failures += 1
                wait = min(30.0, 0.5 * 2 ** min(failures, 6))
                log.error("schedules: %s; trying again in %.1fs", exc, wait)
            # A hair past the tick, spread a little: the fleet's workers do not all hit
            # the store in the same millisecond (the store would sort them out anyway).
            wait += random.uniform(0.0, 0.05)
            try:
                await asyncio.wait_for(stop.wait(), timeout=wait)
            except TimeoutError:
                pass
