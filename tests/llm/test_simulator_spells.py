"""The simulator's outages and keys (herd/testing/simulator/spells.py), read by the
official SDKs: a model overloaded or down for a time in each provider's error format,
keys with buckets of their own sizes, and a key the provider refuses."""

from __future__ import annotations

import json
import time

import anthropic as anthropic_sdk
import httpx
import openai as openai_sdk
import pytest

from herd.limits import key_id
from herd.testing.simulator import Simulator
from herd.testing.simulator.__main__ import build_parser, config_from
from tests.llm.conftest import Sim

BODY = {"max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def openai_client(sim: Sim, key: str = "sk-a") -> openai_sdk.OpenAI:
    return openai_sdk.OpenAI(base_url=sim.openai_url, api_key=key, max_retries=0)


def anthropic_client(sim: Sim, key: str = "sk-a") -> anthropic_sdk.Anthropic:
    return anthropic_sdk.Anthropic(base_url=sim.url, api_key=key, max_retries=0)


def test_a_down_model_answers_529_overloaded_to_the_anthropic_sdk(sim: Sim) -> None:
    sim.configure(spells=[{"model": "claude-down", "status": 529, "for": 300}])
    with anthropic_client(sim) as client:
        with pytest.raises(anthropic_sdk.OverloadedError) as down:
            client.messages.create(model="claude-down", **BODY)  # type: ignore[arg-type]
        other = client.messages.create(model="claude-up", **BODY)  # type: ignore[arg-type]
    assert down.value.status_code == 529
    assert down.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert "retry-after" not in down.value.response.headers
    assert other.content[0].type == "text"
    stats = sim.stats()
    # The outage is per model, answered at once and not billed.
    assert stats["spell_errors"] == {"claude-down": 1}
    assert (stats["billed"], stats["by_status"]) == (1, {"529": 1, "200": 1})


@pytest.mark.parametrize("status", [503, 500])
def test_a_5xx_spell_reaches_the_openai_sdk_as_a_server_error(sim: Sim, status: int) -> None:
    sim.configure(spells=[{"model": "gpt-down", "status": status, "for": 300}])
    with openai_client(sim) as client:
        with pytest.raises(openai_sdk.InternalServerError) as down:
            client.chat.completions.create(model="gpt-down", **BODY)  # type: ignore[arg-type]
        client.chat.completions.create(model="gpt-up", **BODY)  # type: ignore[arg-type]
    assert down.value.status_code == status
    assert down.value.body["type"] == "server_error"  # type: ignore[index]
    assert sim.stats()["spell_errors"] == {"gpt-down": 1}


def test_a_spell_ends_on_time_and_a_partial_one_fails_some_calls(sim: Sim) -> None:
    posted = time.monotonic()
    config = sim.configure(spells=[{"model": "*", "status": 529, "for": 2.0}])
    assert config["spells"][0]["status"] == 529 and 0 < config["spells"][0]["ends_in"] <= 2.0
    answered_at = None
    with anthropic_client(sim) as client:
        deadline = posted + 30
        while time.monotonic() < deadline:
            try:
                client.messages.create(model="m", **BODY)  # type: ignore[arg-type]
            except anthropic_sdk.OverloadedError:
                continue
            answered_at = time.monotonic()
            break
    # Down until its end, then back, without a new config.
    assert answered_at is not None and answered_at - posted >= 2.0
    assert sim.stats()["spell_errors"].get("m", 0) >= 1
    sim.reset()
    sim.configure(seed=3, spells=[{"model": "m", "status": 503, "for": 300, "rate": 0.5}])
    codes = []
    with openai_client(sim) as client:
        for _ in range(40):
            try:
                client.chat.completions.create(model="m", **BODY)  # type: ignore[arg-type]
                codes.append(200)
            except openai_sdk.InternalServerError as exc:
                codes.append(exc.status_code)
    assert 5 < codes.count(503) < 35 and codes.count(200) == 40 - codes.count(503)


def test_keys_have_buckets_of_their_own_sizes_and_a_refused_key_gets_401(sim: Sim) -> None:
    config = sim.configure(keys={"sk-small-1111": {"rpm": 1}, "sk-gone-2222": {"refused": True}})
    # The keys are never shown.
    assert config["keys"] == {
        "***1111": {"rpm": 1, "tpm": None, "refused": False},
        "***2222": {"rpm": None, "tpm": None, "refused": True},
    }
    with openai_client(sim, "sk-small-1111") as small, openai_client(sim, "sk-big") as big:
        small.chat.completions.create(model="m", **BODY)  # type: ignore[arg-type]
        with pytest.raises(openai_sdk.RateLimitError):
            small.chat.completions.create(model="m", **BODY)  # type: ignore[arg-type]
        for _ in range(3):  # another key: not limited by the first one's bucket
            big.chat.completions.create(model="m", **BODY)  # type: ignore[arg-type]
    with (
        anthropic_client(sim, "sk-gone-2222") as gone,
        pytest.raises(anthropic_sdk.AuthenticationError),
    ):
        gone.messages.create(model="m", **BODY)  # type: ignore[arg-type]
    stats = sim.stats()
    assert (stats["billed"], stats["rate_limited"]) == (4, 1)
    assert stats["by_status"] == {"200": 4, "429": 1, "401": 1}


@pytest.mark.parametrize(
    "bad",
    [
        {"spells": [{"model": "m", "status": 418, "for": 1}]},
        {"spells": [{"model": "m", "for": -1}]},
        {"spells": [{"model": "m", "for": 1, "rate": 2}]},
        {"spells": [{"model": "m", "for": 1, "until": 3}]},
        {"keys": {"k": {"rpm": 0}}},
        {"keys": {"k": {"refused": "yes"}}},
    ],
)
def test_bad_spells_and_keys_are_refused_with_400(sim: Sim, bad: dict) -> None:
    r = sim.http.post("/_sim/config", json=bad)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_config"


def test_a_simulator_with_a_key_accepts_a_pools_keys_each_with_its_own_bucket() -> None:
    args = build_parser().parse_args(
        ["--api-key", "sk-operator-0000", "--key", "sk-pool-a-1111:1", "--key", "sk-pool-b-2222"]
    )
    simulator = Simulator(config_from(args)).start()
    try:
        url = simulator.url + "/v1"
        with openai_sdk.OpenAI(base_url=url, api_key="sk-pool-a-1111", max_retries=0) as a:
            a.chat.completions.create(model="m", **BODY)  # type: ignore[arg-type]
            with pytest.raises(openai_sdk.RateLimitError):  # its own bucket: one a minute
                a.chat.completions.create(model="m", **BODY)  # type: ignore[arg-type]
        with openai_sdk.OpenAI(base_url=url, api_key="sk-pool-b-2222", max_retries=0) as b:
            for _ in range(3):  # the simulator's (no limit): not A's
                b.chat.completions.create(model="m", **BODY)  # type: ignore[arg-type]
        with (
            openai_sdk.OpenAI(base_url=url, api_key="sk-stranger-3333", max_retries=0) as c,
            pytest.raises(openai_sdk.AuthenticationError),
        ):
            c.chat.completions.create(model="m", **BODY)  # type: ignore[arg-type]
        shown = httpx.get(simulator.url + "/_sim/stats").text
        stats = json.loads(shown)
        assert stats["by_key"] == {
            key_id("sk-pool-a-1111"): {"calls": 2, "rate_limited": 1, "billed": 1},
            key_id("sk-pool-b-2222"): {"calls": 3, "rate_limited": 0, "billed": 3},
        }
        assert "sk-pool" not in shown and "sk-operator" not in shown
    finally:
        simulator.close()
