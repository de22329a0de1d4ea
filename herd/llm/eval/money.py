"""Money as herd keeps it: exact decimals in the store (numeric), Decimal in between,
a float only where a number leaves as JSON, and cents in text."""

from __future__ import annotations

from decimal import Decimal

from herd.llm.completion import Usage
from herd.llm.pricing import Price


def money(value: float | Decimal | int | None) -> Decimal | None:
    """A cost as an exact decimal: a float converts through its shortest repr, so
    0.1 is 0.1, not 0.1000000000000000055…"""
    if value is None:
        return None
    if isinstance(value, Decimal):
        return value
    return Decimal(repr(float(value))) if isinstance(value, float) else Decimal(value)


def as_float(value: Decimal | float | None) -> float | None:
    """A stored amount as a JSON number: the float nearest the exact sum (no residue of
    float additions, which the store no longer makes)."""
    return None if value is None else float(value)


def dollars(value: Decimal | float | None, *, unpriced: str = "unpriced") -> str:
    """``$0.77`` (cents), ``$0.0042`` (to a millionth) for amounts under a cent,
    ``unpriced`` for None: a cost nobody knows is never shown as $0."""
    if value is None:
        return unpriced
    d = money(value)
    assert d is not None
    if d != 0 and abs(d) < Decimal("0.01"):
        return "$" + f"{d:.6f}".rstrip("0")
    return f"${d:,.2f}"


_MILLION = Decimal(1_000_000)
_HALF = Decimal("0.5")


def exact_cost(price: Price, usage: Usage, *, batch: bool = False) -> Decimal:
    """``Price.cost`` (``batch``: ``Price.batch_cost``) in exact decimals: each rate as
    written, so a plan's sum has no float residue (0.1 + 0.2 is 0.3)."""
    i, o = _d(price.input), _d(price.output)
    cached, write = _d(price.cached_rate), _d(price.write_rate)
    if batch:
        bi = i * _HALF if price.batch_input is None else _d(price.batch_input)
        o = o * _HALF if price.batch_output is None else _d(price.batch_output)
        scale = bi / i if i else _HALF
        i, cached, write = bi, cached * scale, write * scale
    return (
        usage.uncached_input_tokens * i
        + usage.cached_input_tokens * cached
        + usage.cache_write_tokens * write
        + usage.output_tokens * o
    ) / _MILLION


def _d(rate: float) -> Decimal:
    found = money(rate)
    assert found is not None
    return found
