"""The simulator's per-call records: a tagged call is attributed, timed, and its answer seen."""

from __future__ import annotations

import httpx

from herd.testing.simulator import SimConfig, Simulator
from tests.helpers import eventually_sync

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_tagged_calls_are_recorded_by_tag_and_untagged_ones_only_counted():
    sim = Simulator(SimConfig(latency=(0.01, 0.01))).start()
    try:
        with httpx.Client(base_url=sim.url, timeout=10) as client:
            for tag in ("7:1:100", "7:1:100", "8:2:101"):
                r = client.post("/v1/chat/completions", json=BODY, headers={"x-sim-tag": tag})
                assert r.status_code == 200
            assert client.post("/v1/chat/completions", json=BODY).status_code == 200
            calls = client.get("/_sim/calls").json()
            stats = client.get("/_sim/stats").json()
            assert stats["calls"] == 4 and calls["tagged_calls"] == 3
            assert sorted(calls["tags"]) == ["7:1:100", "8:2:101"]
            first = calls["tags"]["7:1:100"]
            assert len(first) == 2 and all(c["status"] == 200 for c in first)
            assert all(c["start"] <= c["end"] for c in first)
            client.post("/_sim/reset")
            assert client.get("/_sim/calls").json() == {"tagged_calls": 0, "tags": {}}
    finally:
        sim.close()


def test_a_tagged_call_whose_client_hangs_up_has_no_status():
    sim = Simulator(SimConfig(latency=(2.0, 2.0))).start()
    try:
        with httpx.Client(base_url=sim.url, timeout=0.3) as client:
            try:
                client.post("/v1/chat/completions", json=BODY, headers={"x-sim-tag": "9:1:5"})
            except httpx.TimeoutException:
                pass
        with httpx.Client(base_url=sim.url, timeout=10) as client:

            def ended() -> list:
                records = client.get("/_sim/calls").json()["tags"]["9:1:5"]
                return records if records[0]["end"] is not None else []

            records = eventually_sync(ended, timeout=10, interval=0.05)
            assert records[0]["status"] is None  # no answer was delivered
    finally:
        sim.close()
