"""JSON is the only format herd stores: no pickle, nothing executable.

Every value that reaches a store passes :func:`check` first, so that what the
database, a listing or a dashboard would choke on later (NUL, a lone surrogate,
a nesting too deep to serialize, a size that floods every poll) is refused at
the door, with the field named, while the caller can still fix it.
"""

from __future__ import annotations

import json
from typing import Any

from herd.errors import InvalidInput, NotJSONSerializable

JSON = Any  # a value json.dumps accepts; mypy cannot express the recursive type usefully

# Defaults of the settings HERD_MAX_JSON_DEPTH / HERD_MAX_PAYLOAD_BYTES / HERD_MAX_RESULT_BYTES.
# pydantic refuses to serialize past depth 255 and json.dumps recurses: 64 leaves room.
MAX_DEPTH = 64
MAX_BYTES = 1 << 20


def text_problem(value: str) -> str | None:
    """Why a string cannot be stored (NUL, lone surrogate), or None."""
    at = value.find("\x00")
    if at >= 0:
        return f"contains a NUL character at position {at}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains a lone surrogate at position {exc.start} (not valid UTF-8)"
    return None


def check_text(value: str, field: str, *, max_length: int | None = None) -> str:
    """Refuse a name or text that no store keeps intact; return it unchanged."""
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be a string, not {type(value).__name__}", field=field)
    problem = text_problem(value)
    if problem:
        raise InvalidInput(f"{field} {problem}", field=field)
    if max_length is not None and len(value) > max_length:
        raise InvalidInput(
            f"{field} is {len(value)} characters long; the limit is {max_length}", field=field
        )
    return value


def _walk(value: JSON, field: str, max_depth: int) -> None:
    """Depth and characters, checked iteratively: a hostile value cannot blow the stack."""
    stack: list[tuple[Any, int, str]] = [(value, 1, field)]
    while stack:
        item, depth, where = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                raise InvalidInput(f"{_short(where)} {problem}", field=_short(where))
        elif isinstance(item, dict | list | tuple):
            if depth > max_depth:
                raise InvalidInput(
                    f"{field} is nested more than {max_depth} levels deep;"
                    " the limit is HERD_MAX_JSON_DEPTH",
                    field=field,
                )
            if isinstance(item, dict):
                for k, v in item.items():
                    if isinstance(k, str):
                        problem = text_problem(k)
                        if problem:
                            raise InvalidInput(
                                f"a key of {_short(where)} {problem}", field=_short(where)
                            )
                    stack.append((v, depth + 1, f"{where}.{k}"))
            else:
                stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(item))


def _check_depth(value: JSON, field: str, max_depth: int) -> None:
    level: list[Any] = [value]
    depth = 0
    while level:
        containers = [v for v in level if isinstance(v, dict | list | tuple)]
        if not containers:
            return
        depth += 1
        if depth > max_depth:
            raise InvalidInput(
                f"{field} is nested more than {max_depth} levels deep;"
                " the limit is HERD_MAX_JSON_DEPTH",
                field=field,
            )
        level = [v for c in containers for v in (c.values() if isinstance(c, dict) else c)]


def _short(where: str) -> str:
    """A path for a message: keys are user text, so a hostile one cannot flood it."""
    return where if len(where) <= 120 else where[:117] + "..."


def check(
    value: JSON,
    *,
    what: str = "value",
    max_depth: int = MAX_DEPTH,
    max_bytes: int | None = None,
    limit_name: str = "HERD_MAX_PAYLOAD_BYTES",
) -> str:
    """Validate and serialize for storage; the text returned is what is stored.

    The common case costs one walk over the containers and one C-speed dumps; the
    strings are walked one by one only when dumps found a bad one, to name its field.
    """
    _check_depth(value, what, max_depth)
    try:
        text = dumps(value, what=what)
    except NotJSONSerializable:
        _walk(value, what, max_depth)
        raise
    if max_bytes is not None:
        size = len(text.encode("utf-8"))
        if size > max_bytes:
            raise InvalidInput(
                f"{what} is {size} bytes as JSON; the limit is {max_bytes} ({limit_name})",
                field=what,
            )
    return text


def dumps(value: JSON, *, what: str = "value") -> str:
    """Serialize for storage, refusing what the database would refuse later.

    PostgreSQL's jsonb rejects NaN/Infinity and the NUL character, so we refuse
    them here, at enqueue, where the caller still sees the error.
    """
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        raise InvalidInput(f"{what} is nested too deep to serialize", field=what) from None
    except (TypeError, ValueError) as exc:
        raise NotJSONSerializable(f"{what} is not JSON: {exc}") from None
    # json.dumps escapes a NUL as \u0000; a literal backslash before "u0000" comes out as
    # \\u0000, which is text, not a NUL. Only an odd run of backslashes is an escape.
    if "\\u0000" in text and _has_nul_escape(text):
        raise NotJSONSerializable(f"{what} contains a NUL character, which JSON storage refuses")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(
            f"{what} contains a lone surrogate (not valid UTF-8) near position {exc.start}",
            field=what,
        ) from None
    return text


def _has_nul_escape(text: str) -> bool:
    start = 0
    while (at := text.find("\\u0000", start)) >= 0:
        run = 0
        while at - run - 1 >= 0 and text[at - run - 1] == "\\":
            run += 1
        if run % 2 == 0:
            return True
        start = at + 1
    return False


def canonical(value: JSON) -> str:
    """Canonical JSON (sorted keys, no whitespace): equal values give equal text."""
    try:
        return json.dumps(
            value, sort_keys=True, allow_nan=False, ensure_ascii=False, separators=(",", ":")
        )
    except RecursionError:
        raise InvalidInput("value is nested too deep to serialize", field="value") from None
    except (TypeError, ValueError) as exc:
        raise NotJSONSerializable(f"value is not JSON: {exc}") from None


def loads(text: str) -> JSON:
    """Parse stored JSON (never pickle, never eval)."""
    return json.loads(text)
