"""What a call cost: a small price table, in US dollars per million tokens.

Load one from a dict, a JSON file or a TOML file, in either shape::

    # prices.toml
    [models."gpt-4o"]
    input = 2.50      # USD per 1M input tokens
    output = 10.00    # USD per 1M output tokens

    {"gpt-4o": {"input": 2.5, "output": 10.0}}          # JSON, flat
    {"models": {"gpt-4o": {"input": 2.5, "output": 10}}} # JSON, like the TOML

A key is a model name (``gpt-4o``) or ``provider/model`` (``vllm/llama-3-8b``), the
latter winning. A dated snapshot that answers (``gpt-4o-2024-08-06``,
``claude-sonnet-4-5-20250929``) is priced as its undated name. An unknown model
costs ``None``, never an exception: the price of a model nobody priced is unknown,
not zero.

``DEFAULT_PRICES`` holds list prices of a few common models as published in 2025;
prices change, so load your own table for anything that matters.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from herd.errors import ConfigError
from herd.llm.completion import Completion, Usage

_DATED = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens."""

    input: float
    output: float

    def cost(self, usage: Usage) -> float:
        return (usage.input_tokens * self.input + usage.output_tokens * self.output) / 1_000_000


DEFAULT_PRICES: dict[str, Price] = {
    "gpt-4o": Price(2.50, 10.00),
    "gpt-4o-mini": Price(0.15, 0.60),
    "gpt-4.1": Price(2.00, 8.00),
    "gpt-4.1-mini": Price(0.40, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.40),
    "claude-opus-4-1": Price(15.00, 75.00),
    "claude-sonnet-4-5": Price(3.00, 15.00),
    "claude-sonnet-4": Price(3.00, 15.00),
    "claude-haiku-4-5": Price(1.00, 5.00),
    "claude-3-5-haiku": Price(0.80, 4.00),
}


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

    def cost_of(self, model: str, usage: Usage, provider: str | None = None) -> float | None:
        price = self.lookup(model, provider)
        return None if price is None else price.cost(usage)

    def cost(self, completion: Completion) -> float | None:
        """US dollars the completion cost, or ``None`` if its model is not priced."""
        return self.cost_of(completion.model, completion.usage, completion.provider)


def cost(completion: Completion, table: PriceTable | None = None) -> float | None:
    """The cost of ``completion`` in US dollars by ``table`` (default prices if none)."""
    return (table if table is not None else PriceTable.default()).cost(completion)


def _price(model: str, value: Price | Mapping[str, Any]) -> Price:
    if isinstance(value, Price):
        price = value
    elif isinstance(value, Mapping):
        try:
            price = Price(float(value["input"]), float(value["output"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"price table: {model!r} needs numbers 'input' and 'output' (USD per 1M tokens)"
            ) from exc
    else:
        raise ConfigError(f"price table: {model!r} is not a table with 'input' and 'output'")
    if price.input < 0 or price.output < 0:
        raise ConfigError(f"price table: {model!r} has a negative price")
    return price
