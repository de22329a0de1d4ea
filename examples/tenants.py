"""Three tenants share one queue: acme with a long backlog, two small ones beside it.

    python examples/tenants.py enqueue                          # 300 + 20 + 20 jobs
    herd worker examples.tenants:app --concurrency 10            # in another terminal
    herd jobs stats --by-key                                     # while it runs

Each job sleeps half a second (an LLM call). ``max_running_per_key=3``: at most 3 jobs
of one tenant run at once anywhere in the fleet, and the worker's 10 slots take turns
round the tenants, so globex and initech finish long before acme's backlog does.
"""

from __future__ import annotations

import asyncio
import sys

from herd import App

app = App()


@app.task(name="tenants.summarize", queue="tenants", max_running_per_key=3)
async def summarize(payload: dict[str, object]) -> dict[str, object]:
    await asyncio.sleep(0.5)
    return {"tenant": payload["tenant"], "doc": payload["doc"]}


def enqueue() -> None:
    with app.sync as sync:
        for tenant, docs in (("acme", 300), ("globex", 20), ("initech", 20)):
            sync.enqueue_many(
                "tenants.summarize",
                [{"tenant": tenant, "doc": i} for i in range(docs)],
                concurrency_keys=[f"tenant:{tenant}"] * docs,
            )


if __name__ == "__main__" and sys.argv[1:] == ["enqueue"]:
    enqueue()
