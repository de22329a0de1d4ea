"""Provider prompt caching: the breakpoint and the key sent, the usage read, the price
of cached and written tokens, and the ledger's, status's and /metrics' figures.

The simulator caches as the providers document (herd/testing/simulator/promptcache.py),
so what it reports is what a call that marked its prefix (or did not) gets back."""

from __future__ import annotations

import json
import math
from decimal import Decimal

import anthropic
import openai
import pytest

from herd import App, Worker
from herd.errors import ConfigError, InvalidInput
from herd.llm import eval as evaluate
from herd.llm.completion import Usage
from herd.llm.eval import EvalSpec, submit
from herd.llm.pricing import Price, PriceTable
from herd.llm.providers import Anthropic, OpenAICompatible
from herd.llm.providers.promptcache import prefix_key
from tests.api.conftest import client_of
from tests.api.test_operations import samples
from tests.conftest import truncate
from tests.llm.conftest import clean_eval_tables
from tests.test_cli import herd

# ~2,000 tokens by the simulator's count (4 characters a token): past every minimum.
RUBRIC = "Score the paper for rigour, novelty and clarity; justify each score. " * 120
PREFIX_TOKENS = math.ceil(len(RUBRIC) / 4)
SCHEMA = {
    "type": "object",
    "properties": {"score": {"type": "integer"}},
    "required": ["score"],
    "additionalProperties": False,
}


def sim_tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


async def test_anthropic_marks_a_long_system_prompt_written_once_then_read(sim):
    async with Anthropic(sim.url, "sk-ant-test", model="claude-sonnet-4-5") as p:
        first = await p.complete(RUBRIC, "Paper one.", schema=SCHEMA)
        second = await p.complete(RUBRIC, "Paper two, another document.", schema=SCHEMA)
        off = await p.complete(RUBRIC, "Paper three.", schema=SCHEMA,
                               params={"prompt_cache": False})  # fmt: skip
        short = await p.complete("Rate it.", "Paper four.", schema=SCHEMA)
    assert (first.usage.cache_write_tokens, first.usage.cached_input_tokens) == (PREFIX_TOKENS, 0)
    assert (second.usage.cache_write_tokens, second.usage.cached_input_tokens) == (
        0, PREFIX_TOKENS)  # fmt: skip
    # input_tokens is all the input: Anthropic's three fields added up.
    assert second.usage.input_tokens == sim_tokens(RUBRIC + "\nPaper two, another document.")
    assert second.usage.uncached_input_tokens == second.usage.input_tokens - PREFIX_TOKENS
    # Switched off by the params (and not sent: the simulator saw no such field), or a
    # prefix below the model's minimum: no breakpoint, nothing cached.
    assert (off.usage.cache_write_tokens, off.usage.cached_input_tokens) == (0, 0)
    assert (short.usage.cache_write_tokens, short.usage.cached_input_tokens) == (0, 0)
    stats = sim.stats()
    assert (stats["cache_write_tokens"], stats["cached_input_tokens"]) == (
        PREFIX_TOKENS, PREFIX_TOKENS)  # fmt: skip


def test_the_switch_is_checked_and_leaves_herds_cache_key_alone():
    plain = EvalSpec(model="m", system="s")
    off = EvalSpec(model="m", system="s", params={"prompt_cache": False})
    assert off.key("doc") == plain.key("doc")  # the same answer, wherever the prompt is read
    with pytest.raises(InvalidInput, match="params.prompt_cache must be true or false"):
        EvalSpec(model="m", system="s", params={"prompt_cache": "no"})


def test_anthropic_breakpoint_follows_the_models_minimum_and_ttl():
    haiku = Anthropic("http://127.0.0.1:9", "k", model="claude-haiku-4-5", cache_ttl="1h")
    sonnet = Anthropic("http://127.0.0.1:9", "k", model="claude-sonnet-4-5", cache_ttl="1h")
    mid = "abcd" * 1300  # ~1,750 tokens estimated: past Sonnet's minimum (1,024), not Haiku's
    assert haiku._request(mid, "doc", None, {})[2]["system"] == mid
    block = sonnet._request(mid, "doc", None, {})[2]["system"]
    assert block == [
        {"type": "text", "text": mid, "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    ]
    assert "prompt_cache" not in sonnet._request(mid, "doc", None, {"prompt_cache": True})[2]
    with pytest.raises(ValueError, match="cache_ttl"):
        Anthropic("http://127.0.0.1:9", "k", model="m", cache_ttl="2h")  # type: ignore[arg-type]


async def test_openai_sends_one_prompt_cache_key_per_prefix_and_reads_cached_tokens(sim):
    async with OpenAICompatible(sim.openai_url, "sk-test", model="gpt-4o",
                                prompt_cache_key=True) as p:  # fmt: skip
        first = await p.complete(RUBRIC, "Paper one.", schema=SCHEMA)
        second = await p.complete(RUBRIC, "Paper two.", schema=SCHEMA)
    assert sim.stats()["prompt_cache_keys"] == [prefix_key(RUBRIC, SCHEMA)]
    assert first.usage.cached_input_tokens == 0  # written, which OpenAI does not report
    cached = PREFIX_TOKENS - PREFIX_TOKENS % 128  # in 128-token steps past 1,024
    assert second.usage.cached_input_tokens == cached
    assert second.usage.input_tokens == sim_tokens(RUBRIC + "\nPaper two.")
    assert prefix_key(RUBRIC, SCHEMA) != prefix_key(RUBRIC, None)
    # By default only OpenAI's own API gets the field: other servers may refuse it.
    sim.reset()
    async with OpenAICompatible(sim.openai_url, "sk-test", model="gpt-4o") as p:
        await p.complete(RUBRIC, "Paper one.")
    assert sim.stats()["prompt_cache_keys"] == []
    assert OpenAICompatible("https://api.openai.com/v1", "k", model="m").prompt_cache_key


def test_the_official_sdks_parse_the_simulators_cache_usage(sim):
    client = openai.OpenAI(base_url=sim.openai_url, api_key="sk-test", max_retries=0)
    messages = [{"role": "system", "content": RUBRIC}, {"role": "user", "content": "Doc."}]
    client.chat.completions.create(model="gpt-4o", messages=messages)  # type: ignore[arg-type]
    again = client.chat.completions.create(model="gpt-4o", messages=messages)  # type: ignore[arg-type]
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == PREFIX_TOKENS - PREFIX_TOKENS % 128

    ant = anthropic.Anthropic(base_url=sim.url, api_key="sk-ant-test", max_retries=0)
    system = [{"type": "text", "text": RUBRIC, "cache_control": {"type": "ephemeral"}}]
    kw = {"model": "claude-sonnet-4-5", "max_tokens": 50, "system": system,
          "messages": [{"role": "user", "content": "Doc."}]}  # fmt: skip
    one, two = ant.messages.create(**kw), ant.messages.create(**kw)  # type: ignore[call-overload]
    assert (one.usage.cache_creation_input_tokens, one.usage.cache_read_input_tokens) == (
        PREFIX_TOKENS, 0)  # fmt: skip
    assert (two.usage.cache_creation_input_tokens, two.usage.cache_read_input_tokens) == (
        0, PREFIX_TOKENS)  # fmt: skip
    assert two.usage.input_tokens == sim_tokens(RUBRIC + "\nDoc.") - PREFIX_TOKENS
    # A read refreshes the entry's lifetime, here to none: past it, the next call writes.
    sim.configure(prompt_cache_ttl=0)
    assert ant.messages.create(**kw).usage.cache_read_input_tokens == PREFIX_TOKENS  # type: ignore[call-overload]
    four = ant.messages.create(**kw)  # type: ignore[call-overload]
    assert (four.usage.cache_creation_input_tokens, four.usage.cache_read_input_tokens) == (
        PREFIX_TOKENS, 0)  # fmt: skip


def test_cached_and_written_tokens_are_priced_apart():
    sonnet = PriceTable.default().lookup("claude-sonnet-4-5-20250929")
    assert sonnet is not None
    assert (sonnet.cached_input, sonnet.cache_write) == (Decimal("0.3"), Decimal("3.75"))
    usage = Usage(input_tokens=3_000_000, output_tokens=1_000_000,
                  cached_input_tokens=1_000_000, cache_write_tokens=1_000_000)  # fmt: skip
    assert sonnet.cost(usage) == Decimal("22.05")
    assert sonnet.cache_saved(usage) == Decimal("1.95")
    gpt = PriceTable.default().lookup("gpt-4o")
    assert gpt is not None and (gpt.cached_input, gpt.cache_write) == (1.25, 2.5)
    assert (gpt.batch_input, gpt.batch_output) == (1.25, 5.0)
    # A file may name the new rates; one that does not keeps its meaning.
    table = PriceTable({"m": {"input": 2, "output": 4, "cached_input": 0.2}, "old": Price(1, 2)})
    m = table.lookup("m")
    assert m is not None and (m.cached_input, m.cache_write) == (Decimal("0.2"), 2)
    assert table.cost_of("old", Usage(1_000_000, 1_000_000)) == 3.0
    with pytest.raises(ConfigError, match="'m' 'cache_write' must be a number"):
        PriceTable({"m": {"input": 1, "output": 1, "cache_write": "cheap"}})
    with pytest.raises(ConfigError, match="negative"):
        PriceTable({"m": {"input": 1, "output": 1, "cached_input": -1}})


@pytest.fixture
async def app(pg_url, sim, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", sim.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    truncate(pg_url)
    clean_eval_tables(pg_url)
    the_app = App(database_url=pg_url)
    the_app.task(name=evaluate.TASK, queue=evaluate.QUEUE)(evaluate.task.evaluate)
    async with the_app:
        yield the_app


async def test_the_ledger_status_and_metrics_show_the_provider_cache(app, pg_url, tmp_path):
    spec = EvalSpec(model="claude-sonnet-4-5", system=RUBRIC, schema=SCHEMA,
                    provider="anthropic", params={"max_tokens": 50})  # fmt: skip
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("The first paper.")
    (docs / "b.txt").write_text("A second, different paper.")
    report = await submit(app, [docs], spec, batch="pc")
    assert report.queued == 2
    await Worker(app, queues=[evaluate.QUEUE], concurrency=1, poll_interval=0.05,
                 stop_when_idle=True, install_signal_handlers=False).run()  # fmt: skip
    # The first call wrote the rubric, the second read it: 0.75 x input lost, 0.9 x won.
    saved = PREFIX_TOKENS * ((3.0 - 3.75) + (3.0 - 0.3)) / 1e6
    status = (await evaluate.batch_status(app, "pc")).to_json()
    assert status["done"] == 2
    assert status["provider_cache"] == {
        "cached_input_tokens": PREFIX_TOKENS,
        "cache_write_tokens": PREFIX_TOKENS,
        "saved": pytest.approx(saved),
    }
    call = status["ledger"]["call"]
    assert call["saved"] is None  # herd's own cache saved nothing here
    paid = 2 * 3.0 * (sim_tokens(RUBRIC) + 6) / 1e6  # about: full price of the two inputs
    assert call["cost"] < paid - saved * 0.9

    text = herd("eval", "status", "--batch", "pc", url=pg_url)
    assert text.returncode == 0, text.stderr
    assert f"provider cache: {PREFIX_TOKENS:,} input tokens read from it" in text.stdout
    as_json = herd("eval", "status", "--batch", "pc", "--json", url=pg_url)
    cached = json.loads(as_json.stdout)["provider_cache"]
    assert cached["cached_input_tokens"] == PREFIX_TOKENS

    async with client_of(app) as c:
        got = (await c.get("/evals/pc")).json()
        overview = (await c.get("/overview")).json()
        m = samples((await c.get("/metrics")).text)
    assert got["provider_cache"]["cache_write_tokens"] == PREFIX_TOKENS
    row = next(r for r in overview["ledger"] if r["kind"] == "call")
    assert (row["cached_input_tokens"], row["cache_write_tokens"]) == (PREFIX_TOKENS,) * 2
    assert row["provider_cache_saved"] == pytest.approx(saved)
    read = ("herd_eval_provider_cache_tokens_total", (("direction", "read"), ("kind", "call")))
    assert m[read] == PREFIX_TOKENS
    assert m[("herd_eval_provider_cache_saved_dollars", ())] == pytest.approx(saved)


def test_usage_fields_missing_or_null_are_zero():
    oa = OpenAICompatible("http://127.0.0.1:9", "k", model="m")
    answer = {"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": 10}}
    assert oa._parse(answer)[1] == Usage(10, 0, 0, 0)
    answer["usage"] = {"prompt_tokens": 10, "prompt_tokens_details": None}
    assert oa._parse(answer)[1] == Usage(10, 0, 0, 0)
    answer["usage"] = {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}}
    assert oa._parse(answer)[1] == Usage(10, 0, 4, 0)
    an = Anthropic("http://127.0.0.1:9", "k", model="m")
    reply = {"content": [{"type": "text", "text": "x"}], "usage": {"input_tokens": 7,
             "cache_read_input_tokens": None, "output_tokens": 1}}  # fmt: skip
    assert an._parse(reply)[1] == Usage(7, 1, 0, 0)
    reply["usage"] = {"input_tokens": 7, "cache_read_input_tokens": 100,
                      "cache_creation_input_tokens": 20, "output_tokens": 1}  # fmt: skip
    assert an._parse(reply)[1] == Usage(127, 1, 100, 20)  # input_tokens: the whole input
