"""Token estimates reserved before a call, reconciled with the reported usage after.

No tokenizer of the providers' model families ships with herd (tiktoken fetches
its vocabularies from the network; Anthropic publishes none), so the estimate is a
conservative rule unless one is registered (``register_tokenizer``): three ASCII
characters per token, and a token for every other character. English runs about
four characters a token, and CJK one to two tokens a character in the BPE
vocabularies of GPT-4o and Claude, so the rule over-reserves a little; the
reconciliation gives the difference back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

# What a chat format adds per message (role markers) and per request (priming).
PER_MESSAGE = 4
PER_REQUEST = 3
ASCII_PER_TOKEN = 3
OUTPUT_PARAMS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# A scalar's JSON in tokens at most (a number, true/false/null, their separators).
SCALAR_TOKENS = 8

_TOKENIZERS: dict[str, Callable[[str], int]] = {}


def register_tokenizer(model_prefix: str, count: Callable[[str], int]) -> None:
    """Count tokens of models whose name starts with ``model_prefix`` with ``count``."""
    _TOKENIZERS[model_prefix] = count


def has_tokenizer(model: str) -> bool:
    """Whether a registered tokenizer counts ``model``'s tokens (else the rule does)."""
    return any(model.startswith(prefix) for prefix in _TOKENIZERS)


def count_text(text: str, model: str = "") -> int:
    for prefix in sorted(_TOKENIZERS, key=len, reverse=True):
        if model.startswith(prefix):
            return _TOKENIZERS[prefix](text)
    if not text:
        return 0
    ascii_chars = sum(1 for c in text if c < "\x80")
    return math.ceil(ascii_chars / ASCII_PER_TOKEN) + (len(text) - ascii_chars)


def estimate_input(provider: str, model: str, system: str, user: str) -> int:
    """Input tokens of a system and a user message, never fewer than the provider counts
    by the rule of ~4 characters per token."""
    messages = [m for m in (system, user) if m]
    return PER_REQUEST + sum(PER_MESSAGE + count_text(m, model) for m in messages)


def requested_max(params: Mapping[str, Any]) -> int | None:
    """The most output tokens the params ask for, by any of the names providers use;
    None when they name none."""
    for name in OUTPUT_PARAMS:
        value = params.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def estimate_output(
    params: Mapping[str, Any], schema: Mapping[str, Any] | None, default_max: int
) -> int:
    """The most the call may generate: its max_tokens (by any of its names), else a bound
    from the output schema, else ``default_max``."""
    asked = requested_max(params)
    if asked is not None:
        return asked
    if schema is not None:
        bound = schema_bound(schema, schema)
        if bound is not None:
            return min(bound, default_max)
    return default_max


def estimate(
    provider: str,
    model: str,
    system: str,
    user: str,
    params: Mapping[str, Any],
    schema: Mapping[str, Any] | None,
    default_max: int,
) -> int:
    return estimate_input(provider, model, system, user) + estimate_output(
        params, schema, default_max
    )


def schema_bound(schema: Any, root: Any, depth: int = 0) -> int | None:
    """Tokens of the longest JSON value ``schema`` admits; None where it admits any length
    (a string without maxLength, an array without maxItems, open objects)."""
    if depth > 32 or not isinstance(schema, Mapping):
        return None
    if "$ref" in schema:
        ref = schema["$ref"]
        target: Any = root
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return None
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        return schema_bound(target, root, depth + 1)
    if "const" in schema:
        return _json_tokens(schema["const"])
    if "enum" in schema and isinstance(schema["enum"], list) and schema["enum"]:
        return max(_json_tokens(v) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            parts = [schema_bound(s, root, depth + 1) for s in schema[key]]
            return None if not parts or None in parts else max(p for p in parts if p is not None)
    kind = schema.get("type")
    if isinstance(kind, list):
        parts = [schema_bound({**schema, "type": k}, root, depth + 1) for k in kind]
        return None if not parts or None in parts else max(p for p in parts if p is not None)
    if kind == "string":
        n = schema.get("maxLength")
        # Any character may be a token of its own, plus the quotes.
        return n + 2 if isinstance(n, int) and n >= 0 else None
    if kind in ("number", "integer", "boolean", "null"):
        return SCALAR_TOKENS
    if kind == "array":
        n = schema.get("maxItems")
        item = schema_bound(schema.get("items", {}), root, depth + 1)
        if not isinstance(n, int) or item is None:
            return None
        return 2 + n * (item + 1)
    if kind == "object":
        props = schema.get("properties")
        if not isinstance(props, Mapping) or schema.get("additionalProperties", True) is not False:
            return None
        total = 2
        for name, sub in props.items():
            value = schema_bound(sub, root, depth + 1)
            if value is None:
                return None
            total += count_text(f'"{name}":') + value + 1
        return total
    return None


def _json_tokens(value: Any) -> int:
    return count_text(json.dumps(value, ensure_ascii=False)) + 1
