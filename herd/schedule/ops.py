"""The operator's verbs on stored schedules, shared by `herd schedule …`, the API and
the dashboard: list (with the next run and the last run's outcome), pause, resume,
run now, remove. They need no app that defines the schedules: the store has their definitions.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from herd.app import App
from herd.errors import ScheduleNotFound
from herd.queue.base import JobStatus
from herd.schedule.model import ScheduleState
from herd.schedule.ticker import Clock, jobs_for, wall_clock


@dataclass(frozen=True)
class ScheduleView:
    name: str
    task: str
    queue: str
    when: str  # "0 2 * * * (Asia/Jakarta)" or "every 60s"
    policy: str
    catch_up: int
    paused: bool
    # The first tick after the last fired (maybe overdue: no worker ran); None if paused
    next_run: datetime | None
    last_tick: datetime | None
    last_run_at: datetime | None
    last_job_id: int | None
    # The last run's job: pending, processing, succeeded, dead; "purged" once its job
    # is gone (finished jobs are kept HERD_FINISHED_TTL); None before the first run.
    last_outcome: str | None
    last_error: str | None
    runs: int


async def views(
    app: App, names: list[str] | None = None, *, limit: int = 1000
) -> list[ScheduleView]:
    """The stored schedules with their last jobs: two reads, whatever their number."""
    states = (await app.broker.schedules(names))[:limit]
    ids = [s.last_job_id for s in states if s.last_job_id is not None]
    jobs = {j.id: j for j in await app.broker.get_jobs(ids)} if ids else {}
    out = []
    for st in states:
        job = jobs.get(st.last_job_id) if st.last_job_id is not None else None
        outcome: str | None = None
        if st.last_job_id is not None:
            outcome = job.status.value if job is not None else "purged"
        s = st.schedule
        out.append(
            ScheduleView(
                name=s.name, task=s.task, queue=s.queue, when=s.when, policy=s.policy.value,
                catch_up=s.catch_up, paused=st.paused,
                next_run=None if st.paused else st.next_run(),
                last_tick=st.last_tick, last_run_at=st.last_run_at, last_job_id=st.last_job_id,
                last_outcome=outcome,
                last_error=job.last_error if job is not None and job.status != JobStatus.SUCCEEDED
                else None,
                runs=st.runs,
            )
        )  # fmt: skip
    return out


async def _state(app: App, name: str) -> ScheduleState:
    found = await app.broker.schedules([name])
    if not found:
        raise ScheduleNotFound(
            f"no schedule is named {name!r}: `herd schedule list` shows them (a worker of"
            " the app that defines it registers it)"
        )
    return found[0]


async def pause(app: App, name: str) -> ScheduleView:
    """Stop firing ``name``'s ticks (run-now still runs it)."""
    await _state(app, name)
    if not await app.broker.pause_schedule(name, True, None):
        raise ScheduleNotFound(f"no schedule is named {name!r}")
    return (await views(app, [name]))[0]


async def resume(app: App, name: str, *, clock: Clock = wall_clock) -> ScheduleView:
    """Fire ``name``'s ticks again from the next one: the ticks of the pause are dropped."""
    state = await _state(app, name)
    if not await app.broker.pause_schedule(name, False, state.schedule.latest(clock())):
        raise ScheduleNotFound(f"no schedule is named {name!r}")
    return (await views(app, [name]))[0]


async def remove(app: App, name: str) -> ScheduleView:
    """Forget ``name`` (definition and state): for a schedule no app defines any more,
    which would stay listed for ever. A worker of an app that still defines it
    registers it again. Returns what it was."""
    view = (await views(app, [name]))[:1]
    if not view or not await app.broker.remove_schedule(name):
        raise ScheduleNotFound(f"no schedule is named {name!r}")
    return view[0]


async def run_now(app: App, name: str) -> int:
    """Enqueue one run of ``name`` now, paused or not; its tick in the payload is None.
    Returns the job's id.

    The job takes its task's lease, attempts and stalls: from the app when it defines
    the task, else (`herd schedule run-now`, the API: no app of the task) from the job of
    the schedule's last run, which the app of a worker enqueued; herd's defaults only
    when neither is known (never run, or its job purged)."""
    state = await _state(app, name)
    jobs = jobs_for(app, state.schedule, [None])
    last = state.last_job_id
    before = None
    if state.schedule.task not in app.tasks and last is not None:
        before = await app.broker.get_job(last)
    if before is not None:
        jobs = [
            replace(j, lease_seconds=before.lease_seconds, max_attempts=before.max_attempts,
                    max_stalls=before.max_stalls)
            for j in jobs
        ]  # fmt: skip
    results = await app.broker.fire_schedule(name, jobs, after=None, tick=None)
    if not results:
        raise ScheduleNotFound(f"no schedule is named {name!r}")
    return results[0].job_id
