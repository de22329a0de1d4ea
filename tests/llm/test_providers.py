"""The providers against a real simulator process: formats, retries, timeouts, cancellation."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import traceback
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import jsonschema
import pytest

import herd.llm
from herd.errors import ConfigError
from herd.limits.base import MAX_PAUSE
from herd.llm import (
    Anthropic,
    HTTPProvider,
    MissingAPIKey,
    OpenAICompatible,
    ProviderAuthError,
    ProviderError,
    ProviderResponseInvalid,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimited,
    RateLimitInfo,
    RetryPolicy,
    Timeouts,
    parse_retry_after,
)
from herd.testing.simulator import content
from tests.llm.conftest import SECRET, Sim
from tests.llm.schemas import VERDICT

FAST = RetryPolicy(max_tries=3, initial_delay=0.01, max_delay=0.05)
Factory = Callable[..., HTTPProvider]


def openai(sim: Sim, **kw: object) -> HTTPProvider:
    kw.setdefault("retry", FAST)
    return OpenAICompatible(sim.openai_url, SECRET, model="gpt-4o", **kw)  # type: ignore[arg-type]


def anthropic(sim: Sim, **kw: object) -> HTTPProvider:
    kw.setdefault("retry", FAST)
    return Anthropic(sim.url, SECRET, model="claude-sonnet-4-5", **kw)  # type: ignore[arg-type]


def anthropic_tool(sim: Sim, **kw: object) -> HTTPProvider:
    return anthropic(sim, structured="tool", **kw)


BOTH = pytest.mark.parametrize("make", [openai, anthropic], ids=["openai", "anthropic"])
ALL = pytest.mark.parametrize(
    "make", [openai, anthropic, anthropic_tool], ids=["openai", "anthropic", "anthropic-tool"]
)


@pytest.fixture
async def closing() -> AsyncIterator[list[HTTPProvider]]:
    made: list[HTTPProvider] = []
    yield made
    for provider in made:
        await provider.aclose()


def valid(text: str) -> bool:
    return jsonschema.Draft202012Validator(VERDICT).is_valid(json.loads(text))


# Formats -------------------------------------------------------------------------------


@ALL
async def test_answers_are_schema_valid_json_and_depend_on_the_prompt(
    sim: Sim, make: Factory, closing: list[HTTPProvider]
) -> None:
    llm = make(sim)
    closing.append(llm)
    first = await llm.complete("You grade documents.", "document one", schema=VERDICT)
    again = await llm.complete("You grade documents.", "document one", schema=VERDICT)
    other = await llm.complete("You grade documents.", "document two", schema=VERDICT)
    jsonschema.validate(json.loads(first.text), VERDICT)
    jsonschema.validate(json.loads(other.text), VERDICT)
    assert again.text == first.text
    assert other.text != first.text
    assert first.raw_status == 200 and first.attempts == 1
    assert first.provider == llm.name and first.model == llm.model
    assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    assert first.response_id and first.latency > 0


async def test_both_wire_formats_give_the_same_answer_to_the_same_prompt(
    sim: Sim, closing: list[HTTPProvider]
) -> None:
    closing.extend([openai(sim), anthropic(sim), anthropic_tool(sim)])
    texts = [await p.complete("sys", "the doc", schema=VERDICT) for p in closing]
    values = [json.loads(c.text) for c in texts]
    assert values[0] == values[1] == values[2]
    assert sim.stats()["by_api"] == {"openai": 1, "anthropic": 2}


async def test_without_schema_the_answer_is_text(sim: Sim, closing: list[HTTPProvider]) -> None:
    closing.extend([openai(sim), anthropic(sim)])
    for llm in closing:
        done = await llm.complete("", "say something", params={"temperature": 0})
        assert done.text and not done.text.startswith("{")


async def test_anthropic_needs_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(MissingAPIKey, match="ANTHROPIC_API_KEY"):
        Anthropic(model="claude-sonnet-4-5")


async def test_keys_and_base_url_come_from_the_environment(
    sim: Sim, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim.configure(api_key="sk-from-env")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("OPENAI_BASE_URL", sim.openai_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-from-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", sim.url)
    async with OpenAICompatible(model="m") as o, Anthropic(model="m") as a:
        assert (await o.complete("s", "u")).raw_status == 200
        assert (await a.complete("s", "u")).raw_status == 200
    assert sim.stats()["by_status"] == {"200": 2}


# Retries -------------------------------------------------------------------------------


@BOTH
async def test_429_waits_at_least_retry_after_then_succeeds(
    sim: Sim, make: Factory, closing: list[HTTPProvider]
) -> None:
    sim.script("429:1")
    llm = make(sim)  # backoff alone would wait 0.01 s
    closing.append(llm)
    started = time.monotonic()
    done = await llm.complete("s", "u", schema=VERDICT)
    assert time.monotonic() - started >= 1.0
    assert done.attempts == 2 and done.elapsed >= 1.0 and valid(done.text)
    assert sim.stats()["by_status"] == {"429": 1, "200": 1}


@BOTH
async def test_5xx_is_retried(sim: Sim, make: Factory, closing: list[HTTPProvider]) -> None:
    sim.script("500", "503:0")
    llm = make(sim)
    closing.append(llm)
    done = await llm.complete("s", "u", schema=VERDICT)
    assert done.attempts == 3 and valid(done.text)
    assert sim.stats()["by_status"] == {"500": 1, "503": 1, "200": 1}


@BOTH
async def test_exhausted_retries_raise_with_the_status(
    sim: Sim, make: Factory, closing: list[HTTPProvider]
) -> None:
    sim.script("500", "500", "500", "ok")
    llm = make(sim)
    closing.append(llm)
    with pytest.raises(ProviderError) as caught:
        await llm.complete("s", "u")
    exc = caught.value
    assert (exc.status, exc.attempts) == (500, 3)
    assert "HTTP 500" in str(exc) and "after 3 tries" in str(exc)
    assert "Internal server error" in str(exc)  # an excerpt of the body
    assert sim.stats()["calls"] == 3


async def test_exhausted_rate_limits_raise_rate_limited(
    sim: Sim, closing: list[HTTPProvider]
) -> None:
    sim.script("429:0", "429:0", "429:0.25")
    llm = openai(sim)
    closing.append(llm)
    with pytest.raises(RateLimited) as caught:
        await llm.complete("s", "u")
    assert (caught.value.status, caught.value.retry_after, caught.value.attempts) == (429, 0.25, 3)
    assert "retry after 0.25 s" in str(caught.value)


@BOTH
async def test_a_retry_after_of_no_finite_number_is_backed_off_and_a_long_one_is_capped(
    sim: Sim, make: Factory, closing: list[HTTPProvider]
) -> None:
    # "inf" and "1e400" once paused a fleet's limit for ever and failed every later job.
    sim.script("429:inf", "429:1e400", "429:nan", "429:1e9")
    llm = make(sim, retry=RetryPolicy(max_tries=5, initial_delay=0.01, max_delay=0.05))
    closing.append(llm)
    with pytest.raises(RateLimited) as caught:
        await llm.complete("s", "u")
    assert (caught.value.attempts, caught.value.retry_after) == (4, MAX_PAUSE)


@pytest.mark.timeout(10)
async def test_a_long_retry_after_is_raised_not_waited(
    sim: Sim, closing: list[HTTPProvider]
) -> None:
    sim.script("429:120")
    llm = openai(sim, retry=RetryPolicy(max_tries=5, max_retry_after=60))
    closing.append(llm)
    started = time.monotonic()
    with pytest.raises(RateLimited) as caught:
        await llm.complete("s", "u")
    assert time.monotonic() - started < 30  # not the 120 s asked: a bound, not a speed
    assert caught.value.retry_after == 120  # for the queue: Retry(after=...)
    assert sim.stats()["calls"] == 1


async def test_client_errors_are_not_retried(sim: Sim, closing: list[HTTPProvider]) -> None:
    sim.script("400")
    llm = openai(sim)
    closing.append(llm)
    with pytest.raises(ProviderError) as caught:
        await llm.complete("s", "u")
    assert caught.value.status == 400 and caught.value.attempts == 1
    assert sim.stats()["calls"] == 1


async def test_an_unreachable_server_is_retried_then_reported() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    llm = OpenAICompatible(f"http://127.0.0.1:{port}/v1", SECRET, model="m", retry=FAST)
    async with llm:
        with pytest.raises(ProviderUnavailable) as caught:
            await llm.complete("s", "u")
    assert caught.value.attempts == 3 and caught.value.status is None
    assert f"127.0.0.1:{port}" in str(caught.value)


async def test_credentials_in_the_base_url_never_show(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    password = "pw-in-the-url-4711"
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://user:{password}@127.0.0.1:{port}/v1")
    llm = OpenAICompatible(model="m", retry=FAST)
    async with llm:
        with pytest.raises(ProviderUnavailable) as caught:
            await llm.complete("s", "u")
    exc = caught.value
    assert f"http://user:****@127.0.0.1:{port}/v1" in str(exc)
    shown = [str(exc), repr(exc), "".join(traceback.format_exception(exc)), repr(llm)]
    for text in shown:
        assert password not in text


@BOTH
async def test_params_cannot_choose_another_model(
    sim: Sim, make: Factory, closing: list[HTTPProvider]
) -> None:
    llm = make(sim)
    closing.append(llm)
    await llm.complete("s", "u", params={"model": "a-pricier-model", "temperature": 0})
    assert sim.stats()["by_model"] == {llm.model: 1}  # the model it was made for, and priced


def test_a_base_url_without_http_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="http:// or https://"):
        OpenAICompatible("localhost:8000/v1", model="m")
    with pytest.raises(ConfigError, match="http:// or https://"):
        Anthropic("ftp://example.com", SECRET, model="m")


async def test_an_answer_in_another_format_is_invalid(sim: Sim) -> None:
    # The query string swallows "/chat/completions": the call lands on /_sim/reset,
    # whose 200 answer is JSON but no chat completion.
    async with OpenAICompatible(sim.url + "/_sim/reset?to=", model="m", retry=FAST) as llm:
        with pytest.raises(ProviderResponseInvalid) as caught:
            await llm.complete("s", "u")
    assert caught.value.status == 200 and caught.value.attempts == 1
    assert "not a openai response" in str(caught.value)


# Bad content is returned as it came --------------------------------------------------


@ALL
async def test_malformed_and_schema_invalid_json_come_back_as_sent(
    sim: Sim, make: Factory, closing: list[HTTPProvider]
) -> None:
    llm = make(sim)
    closing.append(llm)
    sim.script("ok", "malformed", "schema_invalid")
    good = await llm.complete("s", "u", schema=VERDICT)
    bad = await llm.complete("s", "u", schema=VERDICT)
    invalid = await llm.complete("s", "u", schema=VERDICT)
    value = json.loads(good.text)
    assert bad.text == content.malformed(json.dumps(value, ensure_ascii=False))
    with pytest.raises(ValueError):
        json.loads(bad.text)
    assert json.loads(invalid.text) == content.violate(value, VERDICT)
    assert not valid(invalid.text)
    assert (bad.attempts, invalid.attempts) == (1, 1)  # not the provider's business


# Timeouts and cancellation -----------------------------------------------------------


@BOTH
async def test_a_hanging_call_hits_the_read_timeout(
    sim: Sim, make: Factory, closing: list[HTTPProvider]
) -> None:
    sim.script("hang")
    llm = make(sim, timeout=Timeouts(connect=2, read=0.5))
    closing.append(llm)
    started = time.monotonic()
    with pytest.raises(ProviderTimeout) as caught:
        await llm.complete("s", "u")
    assert 0.5 <= time.monotonic() - started < 30  # the hang lasts an hour
    assert "read timeout of 0.5 s" in str(caught.value)
    assert caught.value.attempts == 1  # the provider may still be billing: not retried
    stats = await sim.wait_for(lambda s: s["disconnected"] == 1)
    assert stats["calls"] == 1 and stats["by_outcome"] == {"hang": 1}


async def test_timeouts_are_retried_when_asked(sim: Sim, closing: list[HTTPProvider]) -> None:
    sim.script("hang", "ok")
    llm = openai(sim, timeout=0.3, retry=RetryPolicy(initial_delay=0.01, retry_timeouts=True))
    closing.append(llm)
    done = await llm.complete("s", "u")
    assert done.attempts == 2
    await sim.wait_for(lambda s: s["disconnected"] == 1 and s["by_status"] == {"200": 1})


@BOTH
async def test_cancelling_the_task_aborts_the_http_call(
    sim: Sim, make: Factory, closing: list[HTTPProvider]
) -> None:
    sim.configure(latency=30)
    llm = make(sim)
    closing.append(llm)
    task = asyncio.create_task(llm.complete("s", "a long document", schema=VERDICT))
    await sim.wait_for(lambda s: s["in_flight"] == 1)
    cancelled_at = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - cancelled_at < 15  # not the 30 s latency
    stats = await sim.wait_for(lambda s: s["disconnected"] == 1 and s["in_flight"] == 0, 15)
    assert stats["calls"] == 1 and stats["by_status"] == {}  # never answered


@pytest.mark.timeout(10)
async def test_cancelling_during_a_backoff_makes_no_further_call(
    sim: Sim, closing: list[HTTPProvider]
) -> None:
    sim.script("429:30")
    llm = openai(sim)
    closing.append(llm)
    task = asyncio.create_task(llm.complete("s", "u"))
    await sim.wait_for(lambda s: s["by_status"] == {"429": 1})
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1.0)
    assert sim.stats()["calls"] == 1


# Secrets -------------------------------------------------------------------------------


@BOTH
async def test_the_api_key_never_shows(
    sim: Sim, make: Factory, closing: list[HTTPProvider], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # httpx and httpcore included
    llm = make(sim)
    closing.append(llm)
    sim.script("500", "ok")
    await llm.complete("s", "u")  # a retry, so something is logged
    assert "HTTP 500" in caplog.text

    sim.configure(api_key="sk-the-right-one")
    async with httpx.AsyncClient() as client:
        raw = await client.post(
            sim.openai_url + "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "u"}]},
            headers={"authorization": f"Bearer {SECRET}"},
        )
    assert SECRET in raw.text  # the server does echo the key it got, like real ones do
    with pytest.raises(ProviderAuthError) as caught:
        await llm.complete("s", "u")
    exc = caught.value
    assert exc.status == 401 and "Invalid API key" in str(exc)
    shown = [
        str(exc),
        repr(exc),
        str(exc.body),
        "".join(traceback.format_exception(exc)),
        repr(llm),
        str(vars(llm)),
        caplog.text,
    ]
    for text in shown:
        assert SECRET not in text


# Pieces ----------------------------------------------------------------------------------


def test_retry_after_in_seconds_milliseconds_or_http_date() -> None:
    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after({"Retry-After": "7"}) == 7.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"Retry-After": later}, now=now) == 30.0
    assert parse_retry_after({"Retry-After": format_datetime(now, usegmt=True)}, now=now) == 0
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({}) is None
    for endless in ("inf", "1e400", "-inf", "nan"):
        assert parse_retry_after({"Retry-After": endless}) is None
        assert parse_retry_after({"retry-after-ms": endless, "Retry-After": "3"}) == 3.0
    assert parse_retry_after({"Retry-After": "99999"}) == MAX_PAUSE
    far = format_datetime(now + timedelta(days=9000), usegmt=True)
    assert parse_retry_after({"Retry-After": far}, now=now) == MAX_PAUSE


def test_backoff_grows_exponentially_with_jitter_up_to_a_cap() -> None:
    policy = RetryPolicy(initial_delay=1.0, max_delay=8.0, jitter=0.5)
    for attempt, base in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        delays = {policy.delay(attempt, None) for _ in range(50)}
        assert all(base * 0.5 <= d <= base for d in delays)
        assert len(delays) > 1  # jittered
    assert all(3.0 <= policy.delay(1, 3.0) <= 3.3 for _ in range(50))  # Retry-After wins


def test_the_package_exports_what_it_names() -> None:
    for name in herd.llm.__all__:
        assert getattr(herd.llm, name) is not None
    assert isinstance(OpenAICompatible(model="m", base_url="http://x/v1"), herd.llm.Provider)


# Rate-limit headers -----------------------------------------------------------------------


def test_openai_durations_and_rate_limit_headers_are_read_and_bad_ones_ignored() -> None:
    from herd.llm.providers import openai_rate_limits, parse_duration

    assert [parse_duration(t) for t in ("6m0s", "1s", "120ms", "1.5s", "1h2m3s", "2")] == [
        360.0,
        1.0,
        0.12,
        1.5,
        3723.0,
        2.0,
    ]
    assert [parse_duration(t) for t in ("", "soon", "5 s", "-1", "1x", "nan", None)] == [None] * 7
    info = openai_rate_limits(
        {
            "X-RateLimit-Limit-Requests": "600",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "100ms",
            "x-ratelimit-limit-tokens": "200000",
            "x-ratelimit-remaining-tokens": "lots",  # unreadable: left out
            "x-ratelimit-reset-tokens": "6m0s",
        }
    )
    assert info == RateLimitInfo(600, 0, 0.1, 200000, None, 360.0)
    assert info.exhausted() == "requests"
    assert openai_rate_limits({"x-ratelimit-reset-tokens": "garbage"}) is None


def test_anthropic_rate_limit_headers_are_read_and_bad_ones_ignored() -> None:
    from herd.llm.providers import anthropic_rate_limits

    now = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
    info = anthropic_rate_limits(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "3",
            "anthropic-ratelimit-requests-reset": "2025-01-01T12:00:04Z",
            "anthropic-ratelimit-tokens-limit": "40000",
            "anthropic-ratelimit-tokens-remaining": "0",
            "anthropic-ratelimit-tokens-reset": "2025-01-01T12:00:30+00:00",
        },
        now=now,
    )
    assert info == RateLimitInfo(50, 3, 4.0, 40000, 0, 30.0)
    assert (info.exhausted(), info.reset_of("tokens")) == ("tokens", 30.0)
    odd = anthropic_rate_limits(
        {"anthropic-ratelimit-requests-reset": "tomorrow", "anthropic-ratelimit-tokens-limit": "-5"}
    )
    assert odd is None


@BOTH
async def test_completions_carry_the_rate_limits_and_a_429_names_its_scope(
    sim: Sim, make: Factory, closing: list[HTTPProvider]
) -> None:
    sim.configure(rpm=1, tpm=100_000)
    llm = make(sim, retry=RetryPolicy(max_tries=4, retry_rate_limited=False))
    closing.append(llm)
    done = await llm.complete("s", "u", params={"max_tokens": 50})
    assert done.rate_limits is not None
    limits = done.rate_limits
    assert (limits.requests_limit, limits.requests_remaining) == (1, 0)
    assert limits.requests_reset is not None and 58 <= limits.requests_reset <= 61  # RFC 3339: s
    assert limits.tokens_limit == 100_000 and limits.tokens_remaining is not None
    assert limits.tokens_remaining < 100_000 - 50  # input + max_tokens charged
    with pytest.raises(RateLimited) as caught:
        await llm.complete("s", "u2")
    assert caught.value.scope == "requests"
    assert caught.value.retry_after is not None and 58 <= caught.value.retry_after <= 61
    assert caught.value.attempts == 1  # raised at once: the fleet's limiter decides
    assert sim.stats()["rate_limited"] == 1


@BOTH
async def test_a_429_without_retry_after_waits_for_the_reset_of_the_exhausted_limit(
    sim: Sim, make: Factory, closing: list[HTTPProvider]
) -> None:
    sim.configure(rpm=100_000, tpm=1_000, limit_retry_after=False)
    # A reset past max_retry_after is raised, not waited: the wait it carries is the reset.
    llm = make(sim, retry=RetryPolicy(max_tries=3, initial_delay=0.01, max_retry_after=5))
    closing.append(llm)
    await llm.complete("s", "u", params={"max_tokens": 900})
    started = time.monotonic()
    with pytest.raises(RateLimited) as caught:
        await llm.complete("s", "u", params={"max_tokens": 900})
    assert time.monotonic() - started < 30  # raised, not the minute's reset waited out
    assert caught.value.scope == "tokens"
    # The bucket is full again in (900 + input) / (1000/60) s: about 54 s.
    assert caught.value.retry_after is not None and 50 < caught.value.retry_after < 61
    assert caught.value.attempts == 1
    stats = sim.stats()
    assert (stats["rate_limited"], stats["billed"]) == (1, 1)
