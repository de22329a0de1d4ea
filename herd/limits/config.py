"""The limits file (HERD_LIMITS, TOML): which limit applies to a provider, model and key.

    [[limits]]
    provider = "openai"          # required
    model = "gpt-4o-mini"        # or "*" (the default): any model of the provider
    key = "env:OPENAI_API_KEY"   # optional: the variable holding the key; absent: any key
    rpm = 600
    tpm = 200000
    max_concurrent = 32
    period = 60                  # optional, seconds

The most specific entry wins (an exact model over "*", then one key over a pool, a
pool over none). Keys are only ever named by their variable; the file holds their
ids, never the keys.

A **pool**: ``key = ["env:OPENAI_API_KEY", "env:OPENAI_API_KEY_2"]`` names several keys
of one provider account kind; each key gets the entry's limits as its own (its own
buckets, its own pauses), and the calls of that provider and model go to whichever
key has room (herd.limits.acquire.hold_any). An entry of one of those keys alone, for
the same provider and model, gives that key limits of its own within the pool.

What could never match is refused, not skipped: a provider herd does not know (names
are compared exactly, so "OpenAI" would limit nothing) and a key variable that is not
set (a typo would leave the key unlimited).
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from herd.errors import ConfigError
from herd.limits.base import Limit, key_id
from herd.masking import remember

SETTING = "HERD_LIMITS"
_FIELDS = {"provider", "model", "key", "rpm", "tpm", "max_concurrent", "period"}
MAX_POOL = 16


@dataclass(frozen=True)
class PoolKey:
    """One key of a pool: the variable that holds it and its id (never the key)."""

    variable: str
    id: str
    limit: Limit  # its own: the pool entry's, or the key's own entry's


@dataclass(frozen=True)
class Entry:
    provider: str
    model: str  # "*": any
    key: str | None  # a key id; None: any key (or a pool's keys, below)
    limit: Limit
    place: str  # "limits[2]", for messages
    # A pool's keys as (variable, id), in the file's order; empty: not a pool.
    pool: tuple[tuple[str, str], ...] = ()
    key_variable: str = ""  # the variable of ``key``

    def specificity(self) -> int:
        keyed = 2 if self.key is not None else 1 if self.pool else 0
        return (4 if self.model != "*" else 0) + keyed

    def matches(self, provider: str, model: str, key: str) -> bool:
        if self.provider != provider or self.model not in ("*", model):
            return False
        if self.pool:
            return any(key == ident for _, ident in self.pool)
        return self.key in (None, key)


@dataclass(frozen=True)
class LimitsFile:
    path: str
    entries: tuple[Entry, ...] = field(default_factory=tuple)

    def limit_for(self, provider: str, model: str, key: str) -> Limit:
        """The limit of the most specific matching entry; ``Limit()`` (falsy) when none."""
        best: Entry | None = None
        for e in self.entries:
            if not e.matches(provider, model, key):
                continue
            if best is None or e.specificity() > best.specificity():
                best = e
        return best.limit if best else Limit()

    def pool_for(self, provider: str, model: str) -> tuple[PoolKey, ...]:
        """The keys the calls of ``provider``'s ``model`` are spread over: the most
        specific pool entry's (an exact model over "*"), each with its own limit; ()
        when no pool applies (the process's one key is used, as without pools)."""
        best: Entry | None = None
        for e in self.entries:
            mine = e.pool and e.provider == provider and e.model in ("*", model)
            if mine and (best is None or e.specificity() > best.specificity()):
                best = e
        if best is None:
            return ()
        return tuple(
            PoolKey(variable, ident, self.limit_for(provider, model, ident))
            for variable, ident in best.pool
        )

    def variables(self) -> dict[str, str]:
        """Key id -> the variable that holds it, for every key the file names: how a
        key is shown (its variable, never the key)."""
        out: dict[str, str] = {}
        for e in self.entries:
            for variable, ident in e.pool:
                out.setdefault(ident, variable)
            if e.key is not None and e.key_variable:
                out.setdefault(e.key, e.key_variable)
        return out


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
    pooled: dict[tuple[str, str, str], str] = {}
    for i, item in enumerate(items):
        place = f"limits[{i}]"
        entry = _entry(where, place, item, providers)
        if entry.pool:
            for variable, ident in entry.pool:
                other = pooled.get((entry.provider, entry.model, ident))
                if other is not None:
                    raise ConfigError(
                        f"{where}: {place}.key: {variable} is in the pool of {other} too,"
                        " for the same provider and model"
                    )
                pooled[(entry.provider, entry.model, ident)] = place
            ident_of: tuple[str, str, str | None] = (entry.provider, entry.model, "pool")
        else:
            ident_of = (entry.provider, entry.model, entry.key)
        if ident_of in seen:
            what = "a second pool of" if entry.pool else "same provider, model and key as"
            raise ConfigError(f"{where}: {place}: {what} {seen[ident_of]}")
        seen[ident_of] = place
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
    variable = ""
    pool: list[tuple[str, str]] = []
    raw_key = item.get("key")
    if isinstance(raw_key, list):
        if not 2 <= len(raw_key) <= MAX_POOL:
            raise bad("key", f"a pool names 2 to {MAX_POOL} keys, not {len(raw_key)}")
        for n, one in enumerate(raw_key):
            ref = _key_ref(one, partial(bad, f"key[{n}]"), True)
            if any(ref[1] == ident for _, ident in pool):
                raise bad(f"key[{n}]", f"{ref[0]:.60} holds the same key as another of the pool")
            pool.append(ref)
    elif raw_key is not None:
        variable, key = _key_ref(raw_key, partial(bad, "key"), False)
    return Entry(provider.strip(), model.strip(), key, limit, place, tuple(pool), variable)


def _key_ref(raw: Any, bad: Callable[[str], ConfigError], pooled: bool) -> tuple[str, str]:
    """``"env:NAME"`` -> (NAME, the id of its key); the key is remembered for masking."""
    if not isinstance(raw, str) or not raw.startswith("env:") or len(raw) < 5:
        # Not echoed: it may be the key itself.
        raise bad(
            'must name the variable holding the key, as "env:NAME" (a pool: a list of'
            " them); a key written in the file is refused (secrets come from the"
            " environment only)"
        )
    variable = raw[4:]
    value = os.environ.get(variable)
    if not value:
        fix = "remove it from the pool" if pooled else "remove the entry's key to limit every key"
        raise bad(f"{variable:.60} is not set (a typo?); set it, or {fix}")
    # Masked wherever it shows up (a pool's second key may be in a variable whose name
    # herd.masking does not take for a secret's).
    remember(value)
    return variable, key_id(value)
