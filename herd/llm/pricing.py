"""What a call cost: a small price table, in US dollars per million tokens.

Load one from a dict, a JSON file or a TOML file, in either shape::

    # prices.toml
    [models."gpt-4o"]
    input = 2.50      # USD per 1M input tokens
    output = 10.00    # USD per 1M output tokens
    cached_input = 1.25   # optional: input read from the provider's prompt cache
    cache_write = 2.50    # optional: input written to it
    batch_input = 1.25    # optional: the Batch API's rates
    batch_output = 5.00

    {"gpt-4o": {"input": 2.5, "output": 10.0}}          # JSON, flat
    {"models": {"gpt-4o": {"input": 2.5, "output": 10}}} # JSON, like the TOML

A key is a model name (``gpt-4o``) or ``provider/model`` (``vllm/llama-3-8b``), the
latter winning. A dated snapshot that answers (``gpt-4o-2024-08-06``,
``claude-sonnet-4-5-20250929``) is priced as its undated name. An unknown model
costs ``None``, never an exception: the price of a model nobody priced is unknown,
not zero.

The optional rates default by the model's family, as the providers publish them:
a Claude model (``claude-*``, ``anthropic/*``) reads its cache at 0.1 x input and
writes it at 1.25 x (the 5-minute lifetime); any other model reads at 0.5 x input
(OpenAI's rate) and writes at the input price (OpenAI charges no write premium);
batch rates are half the standard ones.

``DEFAULT_PRICES`` holds list prices of a few common models as published in 2025;
prices change, so load your own table for anything that matters.

Rates and costs are exact decimals: a float rate (0.15) is taken as written, and a
call's cost is its token counts times its rates with no float rounding, so a ledger
row is 0.00001515, not 0.000015149999999999999.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from decimal import Decimal
from pathlib import Path
from typing import Any

from herd.errors import ConfigError
from herd.llm.completion import Completion, Usage

_DATED = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")
MILLION = Decimal(1_000_000)
HALF = Decimal("0.5")


def exact(rate: float | Decimal | int) -> Decimal:
    """A rate as written: a float through its shortest repr (0.1 is 0.1)."""
    if isinstance(rate, Decimal):
        return rate
    return Decimal(repr(rate)) if isinstance(rate, float) else Decimal(rate)


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens, as exact decimals (floats given are converted as
    written). ``None`` rates take their family's default (``Price.of``); a bare
    ``Price(input, output)`` is OpenAI's shape."""

    input: Decimal
    output: Decimal
    cached_input: Decimal | None = None
    cache_write: Decimal | None = None
    batch_input: Decimal | None = None
    batch_output: Decimal | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                object.__setattr__(self, f.name, exact(value))

    @classmethod
    def of(
        cls, model: str, input: float | Decimal, output: float | Decimal,  # noqa: A002
        **rates: float | Decimal | None,
    ) -> Price:  # fmt: skip
        """A price whose missing rates are ``model``'s family defaults (see the module)."""
        anthropic = model.startswith(("claude", "anthropic/"))
        i, o = exact(input), exact(output)
        defaults = {
            "cached_input": i * Decimal("0.1" if anthropic else "0.5"),
            "cache_write": i * Decimal("1.25" if anthropic else "1"),
            "batch_input": i * HALF,
            "batch_output": o * HALF,
        }
        given = {k: exact(v) for k, v in rates.items() if v is not None}
        return cls(i, o, **{**defaults, **given})

    @property
    def cached_rate(self) -> Decimal:
        return self.input * HALF if self.cached_input is None else self.cached_input

    @property
    def write_rate(self) -> Decimal:
        return self.input if self.cache_write is None else self.cache_write

    def cost(self, usage: Usage) -> Decimal:
        """Uncached input, cached input, cache writes and output, each at its rate."""
        return (
            usage.uncached_input_tokens * self.input
            + usage.cached_input_tokens * self.cached_rate
            + usage.cache_write_tokens * self.write_rate
            + usage.output_tokens * self.output
        ) / MILLION

    def batch_cost(self, usage: Usage) -> Decimal:
        """The cost of a Batch API request: the batch rates (half the synchronous ones by
        default); its prompt-cache reads and writes at their rates scaled alike, as both
        providers stack the two discounts."""
        bi = self.input * HALF if self.batch_input is None else self.batch_input
        bo = self.output * HALF if self.batch_output is None else self.batch_output
        cached = (
            usage.cached_input_tokens * self.cached_rate
            + usage.cache_write_tokens * self.write_rate
        )
        # Scaled last, so a discount that is not a round fraction rounds once.
        scaled = cached * bi / self.input if self.input else cached * HALF
        return (usage.uncached_input_tokens * bi + scaled + usage.output_tokens * bo) / MILLION

    def batch_cache_saved(self, usage: Usage) -> Decimal:
        """What the prompt cache saved on a Batch API request, at the batch rates."""
        bi = self.input * HALF if self.batch_input is None else self.batch_input
        bo = self.output * HALF if self.batch_output is None else self.batch_output
        full = (usage.input_tokens * bi + usage.output_tokens * bo) / MILLION
        return full - self.batch_cost(usage)

    def full_cost(self, usage: Usage) -> Decimal:
        """What ``usage`` would cost with no prompt cache: all input at the input price."""
        return (usage.input_tokens * self.input + usage.output_tokens * self.output) / MILLION

    def cache_saved(self, usage: Usage) -> Decimal:
        """Money the provider's prompt cache saved on ``usage`` (negative: writes that
        no read has paid back yet)."""
        return self.full_cost(usage) - self.cost(usage)


# Cached input as published: gpt-4o and gpt-4o-mini at half the input price, the
# gpt-4.1 family at a quarter; Claude at a tenth (the family default).
DEFAULT_PRICES: dict[str, Price] = {
    "gpt-4o": Price.of("gpt-4o", 2.50, 10.00),
    "gpt-4o-mini": Price.of("gpt-4o-mini", 0.15, 0.60),
    "gpt-4.1": Price.of("gpt-4.1", 2.00, 8.00, cached_input=0.50),
    "gpt-4.1-mini": Price.of("gpt-4.1-mini", 0.40, 1.60, cached_input=0.10),
    "gpt-4.1-nano": Price.of("gpt-4.1-nano", 0.10, 0.40, cached_input=0.025),
    "claude-opus-4-1": Price.of("claude-opus-4-1", 15.00, 75.00),
    "claude-sonnet-4-5": Price.of("claude-sonnet-4-5", 3.00, 15.00),
    "claude-sonnet-4": Price.of("claude-sonnet-4", 3.00, 15.00),
    "claude-haiku-4-5": Price.of("claude-haiku-4-5", 1.00, 5.00),
    "claude-3-5-haiku": Price.of("claude-3-5-haiku", 0.80, 4.00),
}
RATES = ("cached_input", "cache_write", "batch_input", "batch_output")


class PriceTable:
    """Prices by model; ``cost()`` of a completion, ``None`` when the model is not priced."""

    def __init__(self, prices: Mapping[str, Price | Mapping[str, Any]] | None = None) -> None:
        self._prices: dict[str, Price] = {}
        if prices is not None:
            raw: Mapping[str, Any] = prices
            if "models" in prices:
                nested = prices["models"]
                if not isinstance(nested, Mapping):
                    raise ConfigError("price table: 'models' must be a table of models")
                raw = nested
            for model, price in raw.items():
                self._prices[str(model)] = _price(str(model), price)

    @classmethod
    def default(cls) -> PriceTable:
        return cls(DEFAULT_PRICES)

    @classmethod
    def from_file(cls, path: str | Path) -> PriceTable:
        """A table from a ``.toml`` file, or a JSON file (any other suffix)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
            data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"price table {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"price table {path}: not a table of models")
        return cls(data)

    def __len__(self) -> int:
        return len(self._prices)

    def __contains__(self, model: object) -> bool:
        return isinstance(model, str) and self.lookup(model) is not None

    def merged(self, other: PriceTable) -> PriceTable:
        """This table with ``other``'s prices added or replacing these."""
        table = PriceTable()
        table._prices = {**self._prices, **other._prices}
        return table

    def lookup(self, model: str, provider: str | None = None) -> Price | None:
        names = [model]
        undated = _DATED.sub("", model)
        if undated != model:
            names.append(undated)
        for name in names:
            if provider and f"{provider}/{name}" in self._prices:
                return self._prices[f"{provider}/{name}"]
            if name in self._prices:
                return self._prices[name]
        return None

    def cost_of(self, model: str, usage: Usage, provider: str | None = None) -> Decimal | None:
        price = self.lookup(model, provider)
        return None if price is None else price.cost(usage)

    def cost(self, completion: Completion) -> Decimal | None:
        """US dollars the completion cost, or ``None`` if its model is not priced."""
        return self.cost_of(completion.model, completion.usage, completion.provider)


def cost(completion: Completion, table: PriceTable | None = None) -> Decimal | None:
    """The cost of ``completion`` in US dollars by ``table`` (default prices if none)."""
    return (table if table is not None else PriceTable.default()).cost(completion)


def _price(model: str, value: Price | Mapping[str, Any]) -> Price:
    if isinstance(value, Price):
        price = value
    elif isinstance(value, Mapping):
        try:
            price = Price(exact(float(value["input"])), exact(float(value["output"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"price table: {model!r} needs numbers 'input' and 'output' (USD per 1M tokens)"
            ) from exc
        rates: dict[str, float | Decimal | None] = {}
        for name in RATES:
            raw = value.get(name)
            if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int | float)):
                raise ConfigError(f"price table: {model!r} {name!r} must be a number (USD/1M)")
            rates[name] = None if raw is None else float(raw)
        price = Price.of(model, price.input, price.output, **rates)
    else:
        raise ConfigError(f"price table: {model!r} is not a table with 'input' and 'output'")
    rates_given = [price.input, price.output]
    rates_given += [r for r in (getattr(price, n) for n in RATES) if r is not None]
    if any(r < 0 for r in rates_given):
        raise ConfigError(f"price table: {model!r} has a negative price")
    return price
