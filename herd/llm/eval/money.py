"""Money as herd keeps it: exact decimals in the store (numeric), Decimal in between,
a float only where a number leaves as JSON, and cents in text."""

from __future__ import annotations

from decimal import Decimal


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
