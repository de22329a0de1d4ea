"""The simulator: its answers, its knobs, its counters."""

from __future__ import annotations

import asyncio
import hmac
import http.client
import json
import random
from collections.abc import Iterator

import httpx
import jsonschema
import pytest

from herd.llm import OpenAICompatible, ProviderError, RetryPolicy
from herd.testing.simulator import SimConfig, Simulator, SimulatorProcess, content
from herd.testing.simulator.exchange import MAX_BODY_BYTES
from herd.testing.simulator.limits import RateLimits, go_duration, rfc3339
from tests.llm.conftest import Sim
from tests.llm.schemas import SCHEMAS

ONE_TRY = RetryPolicy(max_tries=1)


@pytest.mark.parametrize(
    "schema", SCHEMAS, ids=["verdict", "defs-refs-formats", "enum-array", "allof", "int", "date"]
)
def test_generated_values_follow_the_schema_and_broken_ones_do_not(schema: dict) -> None:
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    seen = set()
    for seed in range(60):
        value = content.generate(schema, random.Random(seed))
        validator.validate(value)
        assert content.generate(schema, random.Random(seed)) == value  # same seed, same value
        seen.add(json.dumps(value, sort_keys=True))
        assert not validator.is_valid(content.violate(value, schema)), value
        with pytest.raises(ValueError):
            json.loads(content.malformed(json.dumps(value)))
    assert len(seen) > 1  # the seed matters


def test_flags_set_the_behaviour_at_start(tmp_path) -> None:
    with SimulatorProcess(
        "--latency",
        "0.1:0.3",
        "--fail-rate",
        "429=0.1,malformed=0.05",
        "--fail-rate",
        "hang=0.01",
        "--script",
        "500,429:2,ok",
        "--retry-after",
        "3",
        "--content",
        "echo",
        "--api-key",
        "sk-sim-flag",
        "--seed",
        "7",
        "--rpm",
        "100",
        "--tpm",
        "50000",
        "--prompt-cache-ttl",
        "60",
        log=tmp_path / "sim.log",
    ) as proc:
        url = proc.url
        config = httpx.get(url + "/_sim/config").json()
        headers = {"authorization": "Bearer sk-sim-flag"}
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
        first = httpx.post(url + "/v1/chat/completions", json=body, headers=headers)
        second = httpx.post(url + "/v1/chat/completions", json=body, headers=headers)
        third = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=5)
        refused = httpx.post(url + "/v1/chat/completions", json=body)
    assert config == {
        "latency": [0.1, 0.3],
        "content": "echo",
        "fixed_text": "",
        "fail_rates": {"rate_limit": 0.1, "malformed": 0.05, "hang": 0.01},
        "script": ["server_error", "rate_limit:2", "ok"],
        "retry_after": 3.0,
        "api_key": "***",  # never shown
        "hang_max": 3600.0,
        "seed": 7,
        "rpm": 100,
        "tpm": 50000,
        "limit_retry_after": True,
        "batch_latency": 1.0,
        "batch_expire": False,
        "prompt_cache_ttl": 60.0,
        "batch_result_faults": [],
        "spells": [],
        "keys": {},
    }
    assert first.status_code == 500
    assert (second.status_code, second.headers["retry-after"]) == (429, "2")
    assert third.status_code == 200
    assert third.json()["choices"][0]["message"]["content"] == "hello"  # echo mode
    assert refused.status_code == 401


def test_runtime_config_changes_and_validates(sim: Sim) -> None:
    assert sim.configure(latency=[0.5, 1.5], content="fixed", fixed_text="x")["latency"] == [
        0.5,
        1.5,
    ]
    for bad in ({"latency": -1}, {"fail_rates": {"429": 0.8, "500": 0.5}}, {"nope": 1}):
        response = sim.http.post("/_sim/config", json=bad)
        assert response.status_code == 400, bad
        assert response.json()["error"]["message"]
    assert sim.http.get("/_sim/config").json()["content"] == "fixed"  # bad updates left it
    sim.reset()
    assert sim.http.get("/_sim/config").json()["content"] == "schema"  # back to start-up


async def test_fixed_and_echo_modes(sim: Sim) -> None:
    async with OpenAICompatible(sim.openai_url, model="m", retry=ONE_TRY) as llm:
        sim.configure(content="fixed", fixed_text="exactly this")
        assert (await llm.complete("s", "u")).text == "exactly this"
        sim.configure(content="echo")
        assert (await llm.complete("s", "the user text")).text == "the user text"


async def test_counter_counts_exactly_the_calls_made(sim: Sim) -> None:
    sim.script("500", "429:0")
    fast = RetryPolicy(max_tries=3, initial_delay=0.01)
    async with (
        OpenAICompatible(sim.openai_url, model="model-a", retry=fast) as a,
        OpenAICompatible(sim.openai_url, model="model-b", retry=fast) as b,
    ):
        done = await asyncio.gather(
            *(a.complete("s", f"doc {i}") for i in range(7)),
            *(b.complete("s", f"doc {i}") for i in range(3)),
        )
    stats = sim.stats()
    tries = sum(c.attempts for c in done)
    assert tries == 12  # ten calls, two of them tried twice
    assert stats["calls"] == tries
    assert sum(stats["by_model"].values()) == tries
    assert stats["by_status"] == {"200": 10, "500": 1, "429": 1}
    assert stats["by_api"] == {"openai": 12}
    assert stats["tokens"]["input"] == sum(c.usage.input_tokens for c in done)
    assert stats["tokens"]["output"] == sum(c.usage.output_tokens for c in done)
    assert stats["disconnected"] == 0 and stats["in_flight"] == 0


async def test_reset_zeroes_the_counters(sim: Sim) -> None:
    async with OpenAICompatible(sim.openai_url, model="m", retry=ONE_TRY) as llm:
        await llm.complete("s", "u")
    assert sim.stats()["calls"] == 1
    sim.reset()
    stats = sim.stats()
    assert (stats["calls"], stats["by_status"], stats["tokens"]["total"]) == (0, {}, 0)


async def test_failure_rates_draw_reproducibly_from_the_seed(sim: Sim) -> None:
    async def run() -> list[int | None]:
        sim.reset()
        sim.configure(fail_rates={"500": 0.3, "429": 0.2}, seed=11)
        statuses: list[int | None] = []
        async with OpenAICompatible(sim.openai_url, model="m", retry=ONE_TRY) as llm:
            for i in range(40):
                try:
                    await llm.complete("s", f"u{i}")
                    statuses.append(200)
                except ProviderError as exc:
                    statuses.append(exc.status)
        return statuses

    first = await run()
    assert await run() == first
    assert {200, 500, 429} <= set(first)
    assert 4 <= first.count(500) <= 20 and first.count(200) >= 10
    stats = sim.stats()
    assert stats["by_status"] == {str(s): first.count(s) for s in set(first)}


async def test_latency_range_is_applied(sim: Sim) -> None:
    sim.configure(latency=[0.4, 0.5])
    async with OpenAICompatible(sim.openai_url, model="m", retry=ONE_TRY) as llm:
        done = await asyncio.gather(*(llm.complete("s", f"u{i}") for i in range(4)))
    assert all(0.4 <= c.latency < 2 for c in done)
    assert sim.stats()["max_in_flight"] == 4  # concurrent, not queued behind each other


@pytest.fixture
def keyed() -> Iterator[Simulator]:
    simulator = Simulator(SimConfig(api_key="sk-operator")).start()
    try:
        yield simulator
    finally:
        simulator.close()


def test_control_routes_need_the_key_when_the_simulator_has_one(keyed: Simulator) -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(base_url=keyed.url, timeout=10) as client:
        for headers in ({}, {"authorization": "Bearer sk-wrong"}, {"x-api-key": "sk-operato"}):
            refused = client.post("/_sim/config", json={"api_key": None}, headers=headers)
            assert refused.status_code == 401, headers
            assert "API key" in refused.json()["error"]["message"]
            assert client.post("/_sim/reset", headers=headers).status_code == 401
        assert client.get("/_sim/config").json()["api_key"] == "***"  # still set
        assert client.post("/v1/chat/completions", json=chat).status_code == 401

        bearer = {"authorization": "Bearer sk-operator"}
        changed = client.post("/_sim/config", json={"api_key": "sk-new"}, headers=bearer)
        assert changed.status_code == 200
        # Now the key in force guards the config; the start-up one still guards reset.
        assert client.post("/_sim/config", json={}, headers=bearer).status_code == 401
        assert client.post(
            "/_sim/config", json={}, headers={"x-api-key": "sk-new"}
        ).status_code == (200)
        assert client.post("/_sim/reset", headers=bearer).status_code == 200
        assert client.post("/v1/chat/completions", json=chat, headers=bearer).status_code == 200


def test_keys_are_compared_in_constant_time(
    keyed: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    with httpx.Client(base_url=keyed.url, timeout=10) as client:
        assert client.post("/v1/chat/completions", json=chat, headers={
            "authorization": "Bearer sk-guess"}).status_code == 401  # fmt: skip
        assert (
            client.post("/_sim/config", json={}, headers={"x-api-key": "sk-x"}).status_code == 401
        )
    assert (b"sk-guess", b"sk-operator") in compared
    assert (b"sk-x", b"sk-operator") in compared


def test_a_body_over_the_limit_is_refused_with_413_unread(sim: Sim) -> None:
    host, port = httpx.URL(sim.url).host, httpx.URL(sim.url).port
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        # Only the headers go out: a server that waited for the body would time out.
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", str(MAX_BODY_BYTES + 1))
        conn.endheaders()
        response = conn.getresponse()
        answer = json.loads(response.read())
    finally:
        conn.close()
    assert response.status == 413
    assert f"over the limit of {MAX_BODY_BYTES}" in answer["error"]["message"]
    assert sim.stats()["calls"] == 0
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 1_000_000}]}
    assert sim.http.post("/v1/chat/completions", json=body).status_code == 200


# Rate limits ------------------------------------------------------------------------------

LIMIT_BODY = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


def test_a_limit_bucket_refills_continuously_and_charges_input_plus_max_output() -> None:
    now = [0.0]
    limits = RateLimits(rpm=60, tpm=1000, clock=lambda: now[0])
    assert all(limits.admit("k", "m", 10).admitted for _ in range(60))  # a full bucket bursts
    refused = limits.admit("k", "m", 10)
    assert (refused.admitted, refused.scope) == (False, "requests")
    assert refused.retry_after == pytest.approx(1.0)  # 60/min refills one a second
    assert limits.admit("k", "other-model", 10).admitted  # per key and model
    assert limits.admit("other-key", "m", 10).admitted
    now[0] = 0.5
    assert not limits.admit("k", "m", 10).admitted  # half a request is not one
    now[0] = 1.0
    ok = limits.admit("k", "m", 10)
    assert ok.admitted  # no reset at the minute: capacity comes back a little at a time
    tokens = {d.name: d for d in ok.dimensions}["tokens"]
    assert tokens.remaining == 1000 - 61 * 10 + 1000 // 60  # 61 charged, 1 s refilled
    assert not limits.admit("k2", "m", 1001).admitted  # more than the whole bucket: never
    big = limits.admit("k3", "m", 900)
    assert big.admitted and not limits.admit("k3", "m", 200).admitted
    assert limits.admit("k3", "m", 200).scope == "tokens"


def test_reset_headers_use_the_providers_formats() -> None:
    assert [go_duration(s) for s in (0.12, 1, 1.5, 360, 3725.5)] == [
        "120ms",
        "1s",
        "1.5s",
        "6m0s",
        "1h2m5.5s",
    ]
    from datetime import UTC, datetime

    at = datetime(2026, 1, 2, 3, 4, 5, 500000, tzinfo=UTC)
    assert rfc3339(10, at) == "2026-01-02T03:04:16Z"  # rounded up: full by then


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_over_the_limit_the_official_sdks_raise_rate_limit_error(sim: Sim, api: str) -> None:
    import anthropic as anthropic_sdk
    import openai as openai_sdk

    sim.configure(rpm=2, tpm=10_000)
    if api == "openai":
        client = openai_sdk.OpenAI(base_url=sim.openai_url, api_key="sk-a", max_retries=0)
        create = client.chat.completions.with_raw_response.create
        error: type[Exception] = openai_sdk.RateLimitError
        prefix = "x-ratelimit-"
    else:
        client = anthropic_sdk.Anthropic(base_url=sim.url, api_key="sk-a", max_retries=0)
        create = client.messages.with_raw_response.create  # type: ignore[assignment]
        error = anthropic_sdk.RateLimitError
        prefix = "anthropic-ratelimit-"
    with client:
        answers = [create(**LIMIT_BODY) for _ in range(2)]
        with pytest.raises(error) as refused:
            create(**LIMIT_BODY)
    first = answers[0].headers
    if api == "openai":
        assert first[prefix + "limit-requests"] == "2"
        assert first[prefix + "remaining-requests"] == "1"
        assert first[prefix + "reset-requests"] == "30s"  # one request back at 2/min
        assert first[prefix + "remaining-tokens"] == str(10_000 - 1 - 64)  # "hi" + max_tokens
        assert refused.value.body["code"] == "rate_limit_exceeded"  # type: ignore[attr-defined]
        assert int(refused.value.response.headers["retry-after-ms"]) > 29_000  # type: ignore[attr-defined]
    else:
        assert first[prefix + "requests-limit"] == "2"
        assert first[prefix + "requests-remaining"] == "1"
        assert first[prefix + "tokens-remaining"] == str(10_000 - 1 - 64)
        assert first[prefix + "requests-reset"].endswith("Z")
        body = refused.value.body  # type: ignore[attr-defined]
        assert body["error"]["type"] == "rate_limit_error"
    headers = refused.value.response.headers  # type: ignore[attr-defined]
    assert headers["retry-after"] in ("30", "31")  # whole seconds, rounded up
    assert any(k.startswith(prefix) for k in headers)  # the 429 carries them too
    stats = sim.stats()
    assert (stats["rate_limited"], stats["billed"], stats["by_status"]) == (
        1,
        2,
        {"200": 2, "429": 1},
    )


def test_billed_counts_calls_that_began_generating_even_if_the_client_left(sim: Sim) -> None:
    sim.configure(latency=2.0)
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(sim.openai_url + "/chat/completions", json=body, timeout=0.3)
    sim.configure(latency=0, script=["500", "hang"], hang_max=0.2)
    assert httpx.post(sim.openai_url + "/chat/completions", json=body).status_code == 500
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(sim.openai_url + "/chat/completions", json=body, timeout=5)
    assert httpx.post(sim.openai_url + "/chat/completions", json=body).status_code == 200
    stats = sim.stats()
    assert stats["billed"] == 2  # the one cut short and the answered one; not 500 nor hang
    assert stats["billed_tokens"]["input"] == 2 * content.estimate_tokens("hello there")
    assert stats["by_status"] == {"200": 1, "500": 1}
    assert stats["rate_limited"] == 0


def test_limits_are_set_and_checked_through_the_control_route(sim: Sim) -> None:
    assert sim.configure(rpm=1, tpm=None)["rpm"] == 1
    for bad in ({"rpm": -1}, {"tpm": "lots"}, {"rpm": 1.5}, {"limit_retry_after": "no"}):
        response = sim.http.post("/_sim/config", json=bad)
        assert response.status_code == 400, bad
        assert (
            "per minute" in response.json()["error"]["message"]
            or "true or false" in (response.json()["error"]["message"])
        )
    url = sim.openai_url + "/chat/completions"
    assert httpx.post(url, json=LIMIT_BODY).status_code == 200
    refused = httpx.post(url, json=LIMIT_BODY)
    assert refused.status_code == 429 and "x-ratelimit-limit-tokens" not in refused.headers
    sim.configure(rpm=None)  # lifted: no limit, no headers
    answer = httpx.post(url, json=LIMIT_BODY)
    assert answer.status_code == 200 and "x-ratelimit-limit-requests" not in answer.headers
