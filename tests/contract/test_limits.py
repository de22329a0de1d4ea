"""Contract: provider limits hold across a fleet, on every backend (herd.limits).

Every test uses scopes of its own (the ``scope`` fixture), so none cleans up.
Times compared are the store's (Grant.at, stats), never the test's clock.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from herd.errors import CapacityTimeout, InvalidInput
from herd.limits import Limit, hold
from herd.limits.base import MAX_PAUSE
from tests.helpers import eventually

ROOT = Path(__file__).resolve().parents[2]
PROCESSES = 3
SECONDS = 3.0


async def granted(limiter, scope, lim, tokens, holder):
    grant = await limiter.try_acquire(scope, lim, tokens, holder, 5.0)
    return grant if grant.granted else None


def max_in_window(grants: list[list[float]], period: float) -> float:
    """The largest total of grants whose store times fall in one window of ``period``."""
    grants = sorted(grants)
    best, total, lo = 0.0, 0.0, 0
    for at, n in grants:
        total += n
        # Half-open window (at - period, at]; 1e-5 s for the stores' printed precision.
        while grants[lo][0] <= at - period + 1e-5:
            total -= grants[lo][1]
            lo += 1
        best = max(best, total)
    return best


def max_overlap(intervals: list[list[float]]) -> int:
    events = sorted([(at, 1) for at, _ in intervals] + [(at + d, -1) for at, d in intervals])
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


async def test_a_fleet_never_exceeds_a_limit_in_any_window_and_uses_it(limiter):
    kind = limiter.name
    url = limiter.url
    scenario = {k: f"fleet-{k}:{uuid.uuid4().hex[:8]}:nokey" for k in ("rpm", "tpm", "slots")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.limits.fleet", kind, url, json.dumps(scenario)]
            + [str(SECONDS)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    try:
        for p in procs:  # every process is connected before any starts
            line = await asyncio.to_thread(p.stdout.readline)
            assert line.strip() == "ready", line
        start = time.time() + 0.2
        for p in procs:
            p.stdin.write(f"go {start}\n")
            p.stdin.flush()
        outs = [json.loads((await asyncio.to_thread(p.communicate, timeout=60))[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs)
    merged = {k: [g for out in outs for g in out[k]] for k in scenario}

    rpm = merged["rpm"]
    assert max_in_window(rpm, 1.0) <= 40
    elapsed = max(at for at, _ in rpm) - min(at for at, _ in rpm)
    # Used, not only bounded: the upper bound is exact, the floor only catches a limiter
    # that refuses or serialises the fleet (a tenth of the limit or less). It is far below
    # the design's 95 % because a client starved of CPU asks late (63 % at load 8, less
    # with the suite's workers in parallel); bench/rate_limits.py measures the use.
    assert len(rpm) >= 0.25 * 40 * elapsed, (len(rpm), elapsed)

    tpm = merged["tpm"]
    assert max_in_window(tpm, 1.0) <= 2000
    elapsed = max(at for at, _ in tpm) - min(at for at, _ in tpm)
    assert sum(n for _, n in tpm) >= 0.25 * 2000 * elapsed, (sum(n for _, n in tpm), elapsed)

    held = merged["slots"]
    assert max_overlap(held) <= 5
    elapsed = max(at + d for at, d in held) - min(at for at, _ in held)
    # Each interval is a lower bound of the time its slot was held (see fleet.py).
    assert sum(d for _, d in held) >= 0.25 * 5 * elapsed, (sum(d for _, d in held), elapsed)


async def test_a_refused_key_pauses_its_scope_without_counting_a_429(limiter, scope):
    await limiter.pause(scope, 30.0, rate_limited=False)
    (stats,) = await limiter.stats([scope])
    assert stats.paused_until is not None and stats.rate_limited == 0
    grant = await limiter.try_acquire(scope, Limit(rpm=1000, period=1.0), 1, "h", 1.0)
    assert not grant.granted and grant.reason == "paused"
    await limiter.pause(scope, 1.0)  # a 429 after it counts, and keeps the longer pause
    (after,) = await limiter.stats([scope])
    assert after.rate_limited == 1 and after.paused_until == stats.paused_until


async def test_a_pause_refuses_everyone_until_it_ends(limiter, scope):
    lim = Limit(rpm=1000, period=1.0)
    await limiter.pause(scope, 0.5)
    await limiter.pause(scope, 0.1)  # a shorter pause does not cut the first short
    (stats,) = await limiter.stats([scope])
    assert stats.paused_until is not None and stats.rate_limited == 2
    refused, deadline = 0, time.monotonic() + 3
    while time.monotonic() < deadline:
        grant = await limiter.try_acquire(scope, lim, 1, "h", 1.0)
        if grant.granted:
            break
        assert grant.reason == "paused" and grant.at < stats.paused_until
        assert grant.wait == pytest.approx(stats.paused_until - grant.at, abs=1e-3)
        refused += 1
        await asyncio.sleep(0.05)
    assert refused >= 3
    assert grant.at >= stats.paused_until
    (after,) = await limiter.stats([scope])
    assert after.paused_until is None and after.requests == 1


async def test_a_pause_is_a_finite_number_of_seconds_and_at_most_an_hour(limiter, scope):
    for endless in (math.inf, -math.inf, math.nan):
        with pytest.raises(InvalidInput, match="finite number of seconds"):
            await limiter.pause(scope, endless)
    assert await limiter.stats([scope]) == []  # nothing stored
    await limiter.pause(scope, 1e9)
    grant = await limiter.try_acquire(scope, Limit(rpm=1000), 1, "h", 1.0)
    assert grant.reason == "paused"
    assert MAX_PAUSE - 60 < grant.wait <= MAX_PAUSE
    (stats,) = await limiter.stats([scope])
    assert stats.paused_until == pytest.approx(grant.at + grant.wait, abs=1e-3)


async def test_a_refund_lets_more_through_and_a_charge_less(limiter, scope):
    lim = Limit(tpm=1000, period=60.0)  # burst 50 tokens; refills ~16 tokens/s
    assert (await limiter.try_acquire(scope, lim, 1000, "h", 1.0)).granted
    refused = await limiter.try_acquire(scope, lim, 30, "h", 1.0)
    assert not refused.granted and refused.reason == "tokens" and refused.wait > 50
    await limiter.adjust(scope, lim, 10 - 1000)  # the call used 10
    assert (await limiter.try_acquire(scope, lim, 30, "h", 1.0)).granted

    other = scope + "2"
    assert (await limiter.try_acquire(other, lim, 1, "h", 1.0)).granted
    await limiter.adjust(other, lim, 100)  # the call used 101
    grant = await limiter.try_acquire(other, lim, 10, "h", 1.0)
    assert not grant.granted and grant.reason == "tokens"
    (a,) = await limiter.stats([scope])
    (b,) = await limiter.stats([other])
    assert a.tokens == 1000 + 30 - 990 and b.tokens == 101


async def test_a_slot_that_is_never_released_frees_itself_after_hold_for(limiter, scope):
    lim = Limit(max_concurrent=1)
    first = await limiter.try_acquire(scope, lim, 0, "dead", 0.4)
    assert first.granted
    assert await limiter.renew(scope, "dead", 0.4)  # renewing restarts the 0.4 s
    refused = await limiter.try_acquire(scope, lim, 0, "next", 5.0)
    assert not refused.granted and refused.reason == "concurrency"
    assert 0 < refused.wait <= 0.41
    grant = await eventually(lambda: granted(limiter, scope, lim, 0, "next"), timeout=3)
    assert grant.at >= first.at + 0.4
    assert not await limiter.renew(scope, "dead", 0.4)  # gone: nothing to renew
    await limiter.release(scope, "next")
    assert (await limiter.try_acquire(scope, lim, 0, "third", 5.0)).granted


async def test_an_acquire_takes_everything_or_nothing(limiter, scope):
    lim = Limit(rpm=100, tpm=1000, max_concurrent=1, period=60.0)
    assert (await limiter.try_acquire(scope, lim, 10, "a", 5.0)).granted
    (before,) = await limiter.stats([scope])
    refused = await limiter.try_acquire(scope, lim, 10, "b", 5.0)
    assert not refused.granted and refused.reason == "concurrency"
    (after,) = await limiter.stats([scope])
    assert (after.requests, after.tokens, after.in_flight) == (1, 10, 1)
    assert after.requests_now == pytest.approx(before.requests_now, abs=0.1)
    assert after.tokens_now == pytest.approx(before.tokens_now, abs=1)


async def test_stats_count_requests_tokens_waits_429s_and_slots(limiter, scope):
    lim = Limit(rpm=600, tpm=100_000, max_concurrent=3, period=3600.0)
    for i in range(3):
        assert (await limiter.try_acquire(scope, lim, 100, f"h{i}", 30.0)).granted
    await limiter.release(scope, "h0")
    await limiter.note_wait(scope, 0.25)
    await limiter.note_wait(scope, 0.5)
    await limiter.pause(scope, 30)
    (s,) = await limiter.stats([scope])
    assert s.scope == scope and s.limit == lim
    assert (s.requests, s.tokens, s.in_flight) == (3, 300, 2)
    assert (s.waits, s.rate_limited) == (2, 1)
    assert s.wait_seconds == pytest.approx(0.75)
    assert 2.9 <= s.requests_now <= 3.0 and 280 <= s.tokens_now <= 300
    assert s.paused_until is not None and s.paused_until > time.time() + 20
    assert scope in {x.scope for x in await limiter.stats()}
    assert await limiter.stats([f"{scope}-never"]) == []


async def test_a_request_larger_than_the_token_limit_is_refused_at_once(limiter, scope):
    with pytest.raises(InvalidInput, match="1001 tokens can never pass the limit of 1000"):
        await limiter.try_acquire(scope, Limit(tpm=1000), 1001, "h", 1.0)


async def test_hold_waits_in_one_queue_per_process_and_releases_its_slot(limiter, scope):
    calls = 0
    real = limiter.try_acquire

    async def counted(*args, **kw):  # the real store call, counted
        nonlocal calls
        calls += 1
        return await real(*args, **kw)

    limiter.try_acquire = counted
    lim = Limit(rpm=20, max_concurrent=2, period=1.0)
    waited = []

    async def call(i: int) -> None:
        async with hold(limiter, scope, lim, 5, holder=f"h{i}", max_wait=10) as slot:
            waited.append(slot.waited)
            await slot.adjust(3)

    await asyncio.gather(*(call(i) for i in range(16)))
    # Only the queue's head asks the store: two or so calls per grant, not 16 polling.
    assert calls <= 3 * 16, calls
    (s,) = await limiter.stats([scope])
    assert s.requests == 16 and s.tokens == 16 * 3 and s.in_flight == 0
    assert s.waits == sum(1 for w in waited if w > 0.001) and s.waits >= 10


async def test_hold_gives_up_past_max_wait_having_taken_nothing(limiter, scope):
    lim = Limit(rpm=60, period=60.0)  # burst 3: the 4th waits about a second
    for _ in range(3):
        assert (await limiter.try_acquire(scope, lim, 0, "h", 1.0)).granted
    with pytest.raises(CapacityTimeout) as caught:
        async with hold(limiter, scope, lim, 0, holder="x", max_wait=0.2):
            raise AssertionError("granted")
    assert caught.value.reason == "requests" and 0.2 < caught.value.retry_in < 1.2
    assert caught.value.scope == scope
    (s,) = await limiter.stats([scope])
    assert s.requests == 3


async def test_hold_releases_the_slot_when_the_call_fails(limiter, scope):
    lim = Limit(max_concurrent=1)
    with pytest.raises(RuntimeError):
        async with hold(limiter, scope, lim, 0, holder="a", hold_for=60):
            raise RuntimeError("the call failed")
    async with hold(limiter, scope, lim, 0, holder="b", hold_for=60, max_wait=0.5) as slot:
        assert slot.waited < 0.2


async def test_a_cost_above_the_burst_passes_once_the_bucket_has_drained(limiter, scope):
    lim = Limit(tpm=1000, period=1.0)  # burst 50, 950 tokens/s
    first = await limiter.try_acquire(scope, lim, 40, "h", 1.0)
    assert first.granted
    big = await limiter.try_acquire(scope, lim, 500, "h", 1.0)
    # Empty at first.at + 40/950 s, then idle for (500 - 50)/950 s.
    assert not big.granted and big.reason == "tokens"
    assert big.at + big.wait == pytest.approx(first.at + (40 + 450) / 950, abs=2e-3)
    grant = await eventually(lambda: granted(limiter, scope, lim, 500, "h"), timeout=3)
    assert grant.at - first.at >= 490 / 950 - 1e-3  # 40 + 500 never in one second
