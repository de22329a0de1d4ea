"""One process of the fleet test: 16 coroutines per scenario, ``seconds`` each, from "go".

    python -m tests.limits.fleet KIND URL SCENARIO_JSON SECONDS

Prints "ready", waits for "go <epoch>" on stdin, runs, prints one JSON object: per scenario,
the grants as [store time, tokens] (rpm, tpm) or [store time, held seconds] (slots).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
import uuid

from herd.limits import CapacityTimeout, Limit, for_broker, hold

COROUTINES = 16
GAP = 1.2  # seconds between phases: more than the holds' max_wait


async def hammer(limiter, scope, limit, until, out):  # type: ignore[no-untyped-def]
    """Raw try_acquire, each coroutine on its own: the store's atomicity under contention."""
    while time.monotonic() < until:
        grant = await limiter.try_acquire(scope, limit, 1, "h", 60.0)
        if grant.granted:
            out.append([grant.at, 1])
        else:
            await asyncio.sleep(grant.wait * random.uniform(1.0, 1.5) + 0.001)


async def tokens(limiter, scope, limit, until, out, rng):  # type: ignore[no-untyped-def]
    while time.monotonic() < until:
        n = rng.randint(10, 100)  # up to the burst (tpm/20)
        try:
            async with hold(limiter, scope, limit, n, holder="h", max_wait=1.0) as slot:
                out.append([slot.at, n])
        except CapacityTimeout:
            pass  # a queue longer than max_wait: refused, nothing taken


async def slots(limiter, scope, limit, until, out):  # type: ignore[no-untyped-def]
    while time.monotonic() < until:
        holder = uuid.uuid4().hex
        try:
            async with hold(limiter, scope, limit, 0, holder=holder, max_wait=1.0) as slot:
                got = time.monotonic()
                await asyncio.sleep(0.1)
                # What the store must have counted as held: [at, at + this] at least.
                out.append([slot.at, time.monotonic() - got])
        except CapacityTimeout:
            pass


async def phase(start: float, k: int, seconds: float) -> float:
    """Sleep until phase ``k`` begins (the test's clock: a start signal, not a decision);
    the monotonic time it ends. The gap is for the queued holds' max_wait."""
    begin = start + k * (seconds + GAP)
    await asyncio.sleep(max(0.0, begin - time.time()))
    return time.monotonic() + seconds


async def main(kind: str, url: str, scenario: dict[str, str], seconds: float) -> None:
    limiter = for_broker(kind, url)
    await limiter.open()
    print("ready", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start = float(line.split()[1])  # the phases of every process start together
    rng = random.Random()
    out: dict[str, list[list[float]]] = {"rpm": [], "tpm": [], "slots": []}
    # One scenario after another: each has the machine to itself.
    until = await phase(start, 0, seconds)
    lim = Limit(rpm=40, period=1.0)
    await asyncio.gather(
        *(hammer(limiter, scenario["rpm"], lim, until, out["rpm"]) for _ in range(COROUTINES))
    )
    until = await phase(start, 1, seconds)
    lim = Limit(tpm=2000, period=1.0)
    await asyncio.gather(
        *(tokens(limiter, scenario["tpm"], lim, until, out["tpm"], rng) for _ in range(COROUTINES))
    )
    until = await phase(start, 2, seconds)
    lim = Limit(max_concurrent=5)
    await asyncio.gather(
        *(slots(limiter, scenario["slots"], lim, until, out["slots"]) for _ in range(COROUTINES))
    )
    await limiter.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])))
