"""Contract: fair shares of a limit (herd.limits.Share), on every backend.

The arithmetic, with no timing: a flow is refused (reason "share") only while another
flow of the scope is waiting (it was refused and told to come back later) and would be
further below its weighted share. A concurrency slot held for 30 s makes a flow wait
for as long as a test needs; releasing it makes capacity free at once.
"""

from __future__ import annotations

import pytest

from herd.errors import InvalidInput
from herd.limits import Limit, Share
from tests.helpers import eventually

# Requests are plentiful (burst 500): only the slot and the share refuse.
LIM = Limit(rpm=10_000, max_concurrent=1, period=60.0)


async def ask(limiter, scope, share, holder, hold_for=30.0, lim=LIM):
    return await limiter.try_acquire(scope, lim, 1, holder, hold_for, share)


async def test_a_flow_over_its_share_yields_to_a_waiting_flow_below_it(limiter, scope):
    big, small = Share("big"), Share("small")
    assert (await ask(limiter, scope, big, "b1")).granted
    refused = await ask(limiter, scope, small, "s1")
    assert not refused.granted and refused.reason == "concurrency"  # small is waiting
    await limiter.release(scope, "b1")
    # Capacity is free, but small waits and has used less: big is refused for its share.
    turned = await ask(limiter, scope, big, "b2")
    assert not turned.granted and turned.reason == "share" and 0 < turned.wait <= 0.1
    assert (await ask(limiter, scope, small, "s1")).granted
    await limiter.release(scope, "s1")
    # Now small has used as much as big: big goes first (small's use is the newer).
    assert (await ask(limiter, scope, big, "b2")).granted
    (stats,) = await limiter.stats([scope])
    assert stats.requests == 3
    shares = {s.flow: s for s in stats.shares}
    assert set(shares) == {"big", "small"}
    assert shares["big"].fair == pytest.approx(0.5) and shares["big"].weight == 1
    assert sum(s.share for s in shares.values()) == pytest.approx(1.0)
    assert shares["big"].share == pytest.approx(2 / 3, abs=0.01)


async def test_weights_divide_the_limit_in_proportion(limiter, scope):
    heavy, light = Share("heavy", weight=2), Share("light", weight=1)
    assert (await ask(limiter, scope, heavy, "h1")).granted
    assert not (await ask(limiter, scope, light, "l1")).granted  # light waits
    await limiter.release(scope, "h1")
    # Weight 2: a second call of heavy is within its share while light has used none.
    assert (await ask(limiter, scope, heavy, "h2")).granted
    await limiter.release(scope, "h2")
    third = await ask(limiter, scope, heavy, "h3")
    assert not third.granted and third.reason == "share"
    assert (await ask(limiter, scope, light, "l1")).granted
    (stats,) = await limiter.stats([scope])
    shares = {s.flow: s for s in stats.shares}
    assert shares["heavy"].fair == pytest.approx(2 / 3) and shares["heavy"].weight == 2
    assert shares["light"].fair == pytest.approx(1 / 3)


async def test_a_flow_nobody_waits_for_takes_all_the_capacity(limiter, scope):
    lim = Limit(rpm=10_000, period=60.0)
    # Another flow was here, but is not waiting: its share goes to whoever asks.
    assert (await ask(limiter, scope, Share("idle"), "i", lim=lim)).granted
    for i in range(20):
        assert (await ask(limiter, scope, Share("busy"), f"b{i}", lim=lim)).granted
    # And a call without a share is never refused for one.
    assert (await limiter.try_acquire(scope, lim, 1, "plain", 1.0)).granted


async def test_a_waiting_flow_that_never_comes_back_stops_holding_capacity(limiter, scope):
    assert (await ask(limiter, scope, Share("a"), "a1", hold_for=0.2)).granted
    gone = await ask(limiter, scope, Share("gone"), "g1")
    assert not gone.granted and gone.wait <= 0.2  # told to come back within 0.2 s
    # "gone" never asks again: within its wait and the grace, "a" is served again.
    grant = await eventually(
        lambda: _granted(limiter, scope, Share("a"), "a2"), timeout=10, interval=0.05
    )
    assert grant.at >= gone.at + gone.wait - 1e-3


async def _granted(limiter, scope, share, holder):
    grant = await ask(limiter, scope, share, holder)
    return grant if grant.granted else None


def test_a_weight_is_a_positive_number_up_to_a_thousand():
    for bad in (0, -1, 1001, float("nan"), True):
        with pytest.raises(InvalidInput, match="weight"):
            Share("b", weight=bad)
