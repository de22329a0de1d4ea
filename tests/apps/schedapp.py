"""A periodic task every SCHED_EVERY seconds (1 by default), named SCHED_NAME, that
back-fills what a fleet missed (catch_up): the fleet tests and the chaos run count one
job per tick."""

from __future__ import annotations

import os

from herd import App

app = App()


@app.periodic(
    every=float(os.environ.get("SCHED_EVERY", "1")),
    policy="catch_up",
    catch_up=1000,
    queue="sched",
    name=os.environ.get("SCHED_NAME", "fleet-tick"),
)
@app.task(name="sched.tick")
def tick(payload: dict[str, str]) -> dict[str, str]:
    return payload
