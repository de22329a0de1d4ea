"""JSON is the only format herd stores: no pickle, nothing executable."""

from __future__ import annotations

import json
from typing import Any

from herd.errors import NotJSONSerializable

JSON = Any  # a value json.dumps accepts; mypy cannot express the recursive type usefully


def dumps(value: JSON, *, what: str = "value") -> str:
    """Serialize for storage, refusing what the database would refuse later.

    PostgreSQL's jsonb rejects NaN/Infinity and the NUL character, so we refuse
    them here, at enqueue, where the caller still sees the error.
    """
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise NotJSONSerializable(f"{what} is not JSON: {exc}") from None
    if "\\u0000" in text:
        raise NotJSONSerializable(f"{what} contains a NUL character, which JSON storage refuses")
    return text


def canonical(value: JSON) -> str:
    """Canonical JSON (sorted keys, no whitespace): equal values give equal text."""
    try:
        return json.dumps(
            value, sort_keys=True, allow_nan=False, ensure_ascii=False, separators=(",", ":")
        )
    except (TypeError, ValueError) as exc:
        raise NotJSONSerializable(f"value is not JSON: {exc}") from None


def loads(text: str) -> JSON:
    """Parse stored JSON (never pickle, never eval)."""
    return json.loads(text)
