"""The limits file (HERD_LIMITS, TOML): which limit applies to a provider, model and key.

    [[limits]]
    provider = "openai"          # required
    model = "gpt-4o-mini"        # or "*" (the default): any model of the provider
    key = "env:OPENAI_API_KEY"   # optional: the variable holding the key; absent: any key
    rpm = 600
    tpm = 200000
    max_concurrent = 32
    period = 60                  # optional, seconds

The most specific entry wins (an exact model over "*", a key over none). Keys are
only ever named by their variable; the file holds their ids, never the keys.

What could never match is refused, not skipped: a provider herd does not know (names
are compared exactly, so "OpenAI" would limit nothing) and a key variable that is not
set (a typo would leave the key unlimited).
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from herd.errors import ConfigError
from herd.limits.base import Limit, key_id

SETTING = "HERD_LIMITS"
_FIELDS = {"provider", "model", "key", "rpm", "tpm", "max_concurrent", "period"}


@dataclass(frozen=True)
class Entry:
    provider: str
    model: str  # "*": any
    key: str | None  # a key id; None: any key
    limit: Limit
    place: str  # "limits[2]", for messages

    def specificity(self) -> int:
        return (2 if self.model != "*" else 0) + (1 if self.key is not None else 0)


@dataclass(frozen=True)
class LimitsFile:
    path: str
    entries: tuple[Entry, ...] = field(default_factory=tuple)

    def limit_for(self, provider: str, model: str, key: str) -> Limit:
        """The limit of the most specific matching entry; ``Limit()`` (falsy) when none."""
        best: Entry | None = None
        for e in self.entries:
            if e.provider != provider or e.model not in ("*", model) or e.key not in (None, key):
                continue
            if best is None or e.specificity() > best.specificity():
                best = e
        return best.limit if best else Limit()


def load(path: str | Path, *, providers: Collection[str]) -> LimitsFile:
    """Read and check a limits file; ConfigError naming the file and place otherwise.
    ``providers``: the names an entry may use (the caller's provider registry: limits
    sit below the providers, which take their pauses from here)."""
    where = str(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot be read ({exc.strerror or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    extra = sorted(set(data) - {"limits"})
    if extra:
        raise ConfigError(f"{where}: {extra[0]}: unknown table; limits go in [[limits]]")
    items = data.get("limits", [])
    if not isinstance(items, list):
        raise ConfigError(f"{where}: limits: must be an array of tables ([[limits]])")
    entries: list[Entry] = []
    seen: dict[tuple[str, str, str | None], str] = {}
    for i, item in enumerate(items):
        place = f"limits[{i}]"
        entry = _entry(where, place, item, providers)
        ident = (entry.provider, entry.model, entry.key)
        if ident in seen:
            raise ConfigError(f"{where}: {place}: same provider, model and key as {seen[ident]}")
        seen[ident] = place
        entries.append(entry)
    return LimitsFile(where, tuple(entries))


def _entry(where: str, place: str, item: Any, providers: Collection[str]) -> Entry:
    def bad(name: str, why: str) -> ConfigError:
        return ConfigError(f"{where}: {place}.{name}: {why}")

    if not isinstance(item, dict):
        raise ConfigError(f"{where}: {place}: must be a table")
    for name in sorted(set(item) - _FIELDS):
        raise bad(name, f"unknown field; expected one of {', '.join(sorted(_FIELDS))}")
    provider = item.get("provider")
    if not isinstance(provider, str) or not provider.strip():
        raise bad("provider", 'required: the provider\'s name, such as "openai"')
    if provider.strip() not in providers:
        known = " or ".join(f'"{p}"' for p in sorted(providers))
        raise bad("provider", f"{provider.strip()!r:.60} is not a provider herd knows; use {known}")
    model = item.get("model", "*")
    if not isinstance(model, str) or not model.strip():
        raise bad("model", 'must be a model name, or "*" for any model')
    values: dict[str, Any] = {}
    for name in ("rpm", "tpm", "max_concurrent"):
        v = item.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise bad(name, "must be a positive integer")
        values[name] = v
    period = item.get("period", 60)
    if (
        isinstance(period, bool)
        or not isinstance(period, int | float)
        or not math.isfinite(period)
        or period <= 0
    ):
        raise bad("period", "must be a positive number of seconds")
    limit = Limit(**values, period=float(period))
    if not limit:
        raise ConfigError(f"{where}: {place}: sets none of rpm, tpm, max_concurrent")
    key: str | None = None
    raw_key = item.get("key")
    if raw_key is not None:
        if not isinstance(raw_key, str) or not raw_key.startswith("env:") or len(raw_key) < 5:
            # Not echoed: it may be the key itself.
            raise bad(
                "key",
                'must name the variable holding the key, as "env:NAME"; a key written'
                " in the file is refused (secrets come from the environment only)",
            )
        variable = raw_key[4:]
        value = os.environ.get(variable)
        if not value:
            raise bad(
                "key",
                f"{variable:.60} is not set (a typo?); set it, or remove the entry's key to"
                " limit every key",
            )
        key = key_id(value)
    return Entry(provider.strip(), model.strip(), key, limit, place)
