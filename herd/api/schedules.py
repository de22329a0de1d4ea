"""Periodic jobs: the stored schedules, pause, resume, run now, remove (operator's token only:
tenant tokens reach none of these routes, herd.api.security)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel

from herd.api.deps import HerdApp
from herd.api.models import ErrorOut
from herd.queue.base import MAX_NAME_LENGTH
from herd.schedule import ops
from herd.schedule.ops import ScheduleView

router = APIRouter(tags=["schedules"])

ScheduleName = Annotated[str, Path(min_length=1, max_length=MAX_NAME_LENGTH)]
NOT_FOUND: dict[int | str, dict[str, object]] = {
    404: {"model": ErrorOut, "description": "no such schedule"}
}


class RunNowOut(BaseModel):
    schedule: str
    job_id: int


@router.get("/schedules")
async def list_schedules(app: HerdApp) -> list[ScheduleView]:
    """Every stored schedule: its ticks, next run, last run and that job's outcome."""
    return await ops.views(app)


@router.post("/schedules/{name}/pause", responses=NOT_FOUND)
async def pause(name: ScheduleName, app: HerdApp) -> ScheduleView:
    """Stop firing the schedule's ticks on every worker until resumed."""
    return await ops.pause(app, name)


@router.post("/schedules/{name}/resume", responses=NOT_FOUND)
async def resume(name: ScheduleName, app: HerdApp) -> ScheduleView:
    """Fire its ticks again from the next one; the ticks of the pause are dropped."""
    return await ops.resume(app, name)


@router.delete("/schedules/{name}", responses=NOT_FOUND)
async def remove(name: ScheduleName, app: HerdApp) -> ScheduleView:
    """Forget a schedule no app defines any more (what it was comes back); a worker of
    an app that still defines it registers it again."""
    return await ops.remove(app, name)


@router.post("/schedules/{name}/run-now", responses=NOT_FOUND)
async def run_now(name: ScheduleName, app: HerdApp) -> RunNowOut:
    """Enqueue one run now, paused or not (its payload's tick is null)."""
    return RunNowOut(schedule=name, job_id=await ops.run_now(app, name))
