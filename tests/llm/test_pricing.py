"""Prices and costs: tables from dicts and files, snapshots, unknown models."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from herd.errors import ConfigError
from herd.llm import Completion, OpenAICompatible, PriceTable, RetryPolicy, Usage, cost
from tests.llm.conftest import Sim


def completion(model: str, usage: Usage, provider: str = "openai") -> Completion:
    return Completion(
        text="{}", usage=usage, model=model, provider=provider, raw_status=200, latency=1.0
    )


def test_cost_is_tokens_times_price_per_million() -> None:
    table = PriceTable({"m": {"input": 3.0, "output": 15.0}})
    used = completion("m", Usage(input_tokens=200_000, output_tokens=10_000))
    assert table.cost(used) == Decimal("0.75")


def test_a_cost_is_exact_with_no_float_residue() -> None:
    # 33 x 0.15 + 17 x 0.60 in floats is 15.149999999999999: a ledger row and a result
    # line read 1.5149999999999999e-05 (seen in `herd eval results`).
    table = PriceTable({"gpt-4o-mini": {"input": 0.15, "output": 0.6}})
    assert table.cost(completion("gpt-4o-mini", Usage(33, 17))) == Decimal("0.00001515")
    assert PriceTable.default().cost(completion("gpt-4o-mini", Usage(33, 17))) == Decimal(
        "0.00001515")  # fmt: skip


def test_unknown_model_costs_none_not_an_error() -> None:
    assert PriceTable({"m": {"input": 1, "output": 1}}).cost(completion("x", Usage(5, 5))) is None
    assert PriceTable().cost(completion("m", Usage(5, 5))) is None
    assert cost(completion("sim-model", Usage(5, 5))) is None  # not in the default table


def test_snapshots_take_the_undated_price_and_provider_keys_win() -> None:
    table = PriceTable(
        {
            "gpt-4o": {"input": 2.5, "output": 10},
            "gpt-4o-mini": {"input": 0.15, "output": 0.6},
            "vllm/gpt-4o": {"input": 0, "output": 0},
            "claude-sonnet-4-5": {"input": 3, "output": 15},
        }
    )
    million_in = Usage(1_000_000, 0)
    assert table.cost(completion("gpt-4o-2024-08-06", million_in)) == 2.5
    assert table.cost(completion("gpt-4o-mini-2024-07-18", million_in)) == Decimal("0.15")
    assert table.cost(completion("claude-sonnet-4-5-20250929", million_in, "anthropic")) == 3
    assert table.cost(completion("gpt-4o", million_in, provider="vllm")) == 0
    assert table.cost(completion("gpt-4o-audio", million_in)) is None  # not a snapshot


def test_tables_load_from_toml_and_json(tmp_path: Path) -> None:
    toml = tmp_path / "prices.toml"
    toml.write_text('[models."gpt-4o"]\ninput = 2.5\noutput = 10.0\n')
    flat = tmp_path / "prices.json"
    flat.write_text(json.dumps({"gpt-4o": {"input": 2.5, "output": 10}}))
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"models": {"gpt-4o": {"input": 2.5, "output": 10}}}))
    used = completion("gpt-4o", Usage(1000, 1000))
    for path in (toml, flat, nested):
        assert PriceTable.from_file(path).cost(used) == Decimal("0.0125")
    assert "gpt-4o" in PriceTable.default() and len(PriceTable.default()) > 0
    merged = PriceTable.default().merged(PriceTable({"gpt-4o": {"input": 0, "output": 0}}))
    assert merged.cost(used) == 0


@pytest.mark.parametrize(
    "table",
    [
        {"m": {"input": 1}},
        {"m": {"input": "cheap", "output": 1}},
        {"m": {"input": -1, "output": 1}},
        {"m": 3},
        {"models": [1, 2]},
    ],
)
def test_bad_tables_are_config_errors(table: dict) -> None:
    with pytest.raises(ConfigError, match="price table"):
        PriceTable(table)


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "prices.toml"
    bad.write_text("[models\n")
    with pytest.raises(ConfigError, match="prices.toml"):
        PriceTable.from_file(bad)
    with pytest.raises(ConfigError, match="missing.json"):
        PriceTable.from_file(tmp_path / "missing.json")


async def test_a_dry_run_against_the_simulator_has_a_cost(sim: Sim) -> None:
    async with OpenAICompatible(
        sim.openai_url, model="gpt-4o", retry=RetryPolicy(max_tries=1)
    ) as llm:
        done = await llm.complete("Grade it.", "x" * 4000)
    assert done.usage.input_tokens >= 1000 and done.usage.output_tokens > 0
    table = PriceTable({"gpt-4o": {"input": 2.5, "output": 10}})
    assert (
        cost(done, table)
        == (done.usage.input_tokens * Decimal("2.5") + done.usage.output_tokens * 10) / 1_000_000
    )
    assert cost(done) is not None  # gpt-4o has a default price
