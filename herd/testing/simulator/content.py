"""The simulator's answers: JSON that follows a JSON Schema, derived from a seed.

``generate(schema, rng)`` supports what structured-output schemas use: ``type``
(also a list of types), ``properties``/``required``/``additionalProperties``,
``items``/``prefixItems``/``minItems``/``maxItems``/``uniqueItems``, ``enum``,
``const``, ``anyOf``/``oneOf``/``allOf``, local ``$ref`` (``#/$defs/...``), string
``minLength``/``maxLength``/``format`` (date, date-time, time, email, uri, uuid),
number ``minimum``/``maximum``/``exclusiveMinimum``/``exclusiveMaximum``/``multipleOf``.
``pattern`` is not honoured. The same seed gives the same value.

``violate(value, schema)`` turns a valid value into one that breaks the schema, and
``malformed(text)`` JSON text into text that does not parse.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from typing import Any

WORDS = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
    "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
    "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu",
)  # fmt: skip
MAX_DEPTH = 8

JSON = Any  # a JSON value: dict, list, str, int, float, bool or None


def seed_of(*parts: JSON) -> int:
    """A stable seed from JSON-able parts (canonical JSON, sha256)."""
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return int.from_bytes(hashlib.sha256(canonical.encode("utf-8")).digest()[:8], "big")


def estimate_tokens(text: str) -> int:
    """About four characters per token, at least one for any non-empty text."""
    return math.ceil(len(text) / 4) if text else 0


def sentence(rng: random.Random, words: int = 12) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def generate(schema: JSON, rng: random.Random, root: JSON = None, depth: int = 0) -> JSON:
    """A value valid against ``schema`` (see the module docstring for what is supported)."""
    root = schema if root is None else root
    if schema is True or schema == {} or not isinstance(schema, dict):
        return sentence(rng, 3)
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    if isinstance(schema.get("allOf"), list):
        merged = _merge_all_of(schema, root)
        return generate(merged, rng, root, depth)
    for key in ("oneOf", "anyOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            non_null = [b for b in branches if _resolve(b, root).get("type") != "null"]
            return generate(rng.choice(non_null or branches), rng, root, depth + 1)
    kind = _type_of(schema, rng)
    if kind == "object":
        return _object(schema, rng, root, depth)
    if kind == "array":
        return _array(schema, rng, root, depth)
    if kind == "string":
        return _string(schema, rng)
    if kind == "integer":
        return _integer(schema, rng)
    if kind == "number":
        return _number(schema, rng)
    if kind == "boolean":
        return rng.random() < 0.5
    return None


def violate(value: JSON, schema: JSON, root: JSON = None) -> JSON:
    """A value close to ``value`` that ``schema`` rejects (best effort for exotic schemas)."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or not schema:
        return {"unexpected": True}
    schema = _resolve(schema, root)
    if isinstance(schema.get("allOf"), list):
        schema = _merge_all_of(schema, root)
    if "enum" in schema or "const" in schema:
        return "not-an-allowed-value-" + str(len(json.dumps(value)))
    kind = _type_of(schema, random.Random(0))
    if kind == "object" and isinstance(value, dict):
        required = [r for r in schema.get("required", []) if r in value]
        if required:
            broken = dict(value)
            del broken[required[0]]
            return broken
        props = schema.get("properties") or {}
        for name in props:
            wrong = _wrong_type(_resolve(props[name], root))
            if wrong is not _NOTHING:
                return {**value, name: wrong}
        if schema.get("additionalProperties") is False:
            return {**value, "unexpected_property": True}
        return ["not", "an", "object"]
    wrong = _wrong_type(schema)
    return {"unexpected": True} if wrong is _NOTHING else wrong


def malformed(text: str) -> str:
    """``text`` cut in the middle, as a model that stopped early would leave it."""
    cut = text[: max(1, len(text) // 2)]
    try:
        json.loads(cut)
    except ValueError:
        return cut
    return cut + ',"'


_NOTHING: Any = object()


def _wrong_type(schema: dict[str, Any]) -> JSON:
    types = schema.get("type")
    allowed = set(types) if isinstance(types, list) else {types} if types else set()
    if not allowed:
        return _NOTHING
    for candidate in ("not-a-number", 12345, ["not", "a", "string"], {"not": "a list"}):
        if not allowed & _types_matching(candidate):
            return candidate
    return _NOTHING


def _types_matching(value: JSON) -> set[str]:
    if isinstance(value, str):
        return {"string"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, list):
        return {"array"}
    return {"object"}


def _resolve(schema: JSON, root: JSON, seen: int = 0) -> dict[str, Any]:
    if not isinstance(schema, dict):
        return {}
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#") or seen > 32:
        return schema
    target: Any = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        target = target.get(part, {}) if isinstance(target, dict) else {}
    rest = {k: v for k, v in schema.items() if k != "$ref"}
    resolved = _resolve(target, root, seen + 1)
    return {**resolved, **rest} if rest else resolved


def _merge_all_of(schema: dict[str, Any], root: JSON) -> dict[str, Any]:
    merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
    for part in schema["allOf"]:
        part = _resolve(part, root)
        if isinstance(part.get("allOf"), list):
            part = _merge_all_of(part, root)
        for key, value in part.items():
            if key == "properties":
                merged["properties"] = {**merged.get("properties", {}), **value}
            elif key == "required":
                merged["required"] = list(dict.fromkeys([*merged.get("required", []), *value]))
            else:
                merged.setdefault(key, value)
    return merged


def _type_of(schema: dict[str, Any], rng: random.Random) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [k for k in kind if k != "null"]
        return str(non_null[0]) if non_null else "null"
    if isinstance(kind, str):
        return kind
    if "properties" in schema or "required" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "multipleOf")):
        return "number"
    return "string"


def _object(schema: dict[str, Any], rng: random.Random, root: JSON, depth: int) -> JSON:
    props: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    out: dict[str, Any] = {}
    for name, sub in props.items():
        if name in required or (depth < MAX_DEPTH and rng.random() < 0.5):
            out[name] = generate(sub, rng, root, depth + 1)
    for name in sorted(required - set(props)):
        out[name] = sentence(rng, 2)
    extra = schema.get("additionalProperties")
    min_props = int(schema.get("minProperties", 0))
    i = 0
    while len(out) < min_props and extra is not False:
        out[f"extra_{i}"] = generate(extra if isinstance(extra, dict) else {}, rng, root, depth + 1)
        i += 1
    return out


def _array(schema: dict[str, Any], rng: random.Random, root: JSON, depth: int) -> JSON:
    raw_prefix = schema.get("prefixItems")
    prefix: list[Any] = raw_prefix if isinstance(raw_prefix, list) else []
    items = schema.get("items", {})
    lo = int(schema.get("minItems", 0 if depth >= MAX_DEPTH else 1))
    hi = int(schema.get("maxItems", lo + 3))
    n = lo if depth >= MAX_DEPTH else rng.randint(lo, max(lo, hi))
    out: list[Any] = []
    for i in range(n):
        sub = prefix[i] if i < len(prefix) else items
        if sub is False:
            break
        value = generate(sub, rng, root, depth + 1)
        if schema.get("uniqueItems"):
            for _ in range(20):
                if value not in out:
                    break
                value = generate(sub, rng, root, depth + 1)
            else:
                if len(out) >= lo:
                    break
        out.append(value)
    return out


def _string(schema: dict[str, Any], rng: random.Random) -> str:
    fmt = schema.get("format")
    if fmt == "date-time":
        text = f"{_date(rng)}T{_time(rng)}Z"
    elif fmt == "date":
        text = _date(rng)
    elif fmt == "time":
        text = f"{_time(rng)}Z"
    elif fmt == "email":
        text = f"{rng.choice(WORDS)}{rng.randint(1, 999)}@example.com"
    elif fmt in ("uri", "url"):
        text = f"https://example.com/{rng.choice(WORDS)}/{rng.randint(1, 9999)}"
    elif fmt == "uuid":
        h = f"{rng.getrandbits(128):032x}"
        text = f"{h[:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:]}"
    else:
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
    lo = int(schema.get("minLength", 0))
    hi = schema.get("maxLength")
    while len(text) < lo:
        text += " " + rng.choice(WORDS)
    if hi is not None:
        text = text[: int(hi)]
    return text


def _date(rng: random.Random) -> str:
    return f"{rng.randint(2000, 2030):04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _time(rng: random.Random) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"


def _bounds(schema: dict[str, Any], integer: bool) -> tuple[float, float]:
    lo: float = schema.get("minimum", -math.inf)
    hi: float = schema.get("maximum", math.inf)
    step = 1 if integer else 1e-6
    if "exclusiveMinimum" in schema and isinstance(schema["exclusiveMinimum"], int | float):
        lo = max(lo, schema["exclusiveMinimum"] + step)
    if "exclusiveMaximum" in schema and isinstance(schema["exclusiveMaximum"], int | float):
        hi = min(hi, schema["exclusiveMaximum"] - step)
    if math.isinf(lo) and math.isinf(hi):
        lo, hi = 0, 100
    elif math.isinf(lo):
        lo = hi - 100
    elif math.isinf(hi):
        hi = lo + 100
    return lo, max(lo, hi)


def _integer(schema: dict[str, Any], rng: random.Random) -> int:
    lo, hi = _bounds(schema, integer=True)
    ilo, ihi = math.ceil(lo), math.floor(hi)
    step = schema.get("multipleOf")
    if isinstance(step, int) and step > 0:
        first, last = math.ceil(ilo / step), math.floor(ihi / step)
        if first <= last:
            return rng.randint(first, last) * step
    return rng.randint(ilo, max(ilo, ihi))


def _number(schema: dict[str, Any], rng: random.Random) -> float | int:
    lo, hi = _bounds(schema, integer=False)
    step = schema.get("multipleOf")
    if isinstance(step, int | float) and step > 0:
        first, last = math.ceil(lo / step), math.floor(hi / step)
        if first <= last:
            k = rng.randint(first, last)
            return k * step if isinstance(step, int) else round(k * step, 10)
    value = round(rng.uniform(lo, hi), 3)
    return min(max(value, lo), hi)


def text_of(value: Any) -> str:
    """The text of a message content: a string, or a list of text parts."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(
            str(p.get("text", "")) for p in value if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""
