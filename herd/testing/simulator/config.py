"""The simulator's behaviour (``SimConfig``) and the parsers of its flags and JSON.

``/_sim/config`` and the command line both go through ``SimConfig.update``, so a value
is checked the same way wherever it comes from.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from herd.errors import ConfigError
from herd.testing.simulator.spells import KeyRule, Spell, masked, parse_keys, parse_spells

OUTCOMES = ("ok", "rate_limit", "server_error", "malformed", "schema_invalid", "hang")
ALIASES = {"429": "rate_limit", "500": "server_error", "invalid": "schema_invalid"}
CONTENT_MODES = ("schema", "echo", "fixed")
# Faults a batch's results can carry (batches.py, ``faulty``), for testing the clients:
# a line with custom_id "", the last answer under a cut (unknown) id, the first line
# twice, a line that is not JSON, a line whose response (Anthropic: result) is not an
# object.
RESULT_FAULTS = ("empty_id", "unknown_id", "duplicate", "not_json", "not_object")


@dataclass
class SimConfig:
    """The simulator's behaviour. ``latency`` is ``(low, high)`` seconds, drawn uniformly."""

    latency: tuple[float, float] = (0.0, 0.0)
    content: str = "schema"  # schema: JSON from the requested schema (text without one)
    fixed_text: str = ""  # the answer when content == "fixed"
    fail_rates: dict[str, float] = field(default_factory=dict)  # outcome or status -> P
    script: list[str] = field(default_factory=list)  # outcomes for the next calls, in order
    retry_after: float = 1.0  # seconds, sent with every 429
    api_key: str | None = None  # when set, calls must carry it
    hang_max: float = 3600.0
    seed: int | None = None  # for the failure draws
    rpm: int | None = None  # requests per minute, per key and model (limits.py)
    tpm: int | None = None  # tokens (input + max output) per minute, per key and model
    # Providers send Retry-After with a limit's 429; off, a client must read the reset headers.
    limit_retry_after: bool = True
    batch_latency: float = 1.0  # seconds from a batch's creation to its end (batches.py)
    batch_expire: bool = False  # batches created while set end expired, nothing answered
    # RESULT_FAULTS in the results of batches created while set (taken at creation)
    batch_result_faults: list[str] = field(default_factory=list)
    prompt_cache_ttl: float = 300.0  # seconds a cached prompt prefix lives (promptcache.py)
    # A model overloaded or down for a time, and keys with limits of their own (spells.py).
    spells: list[Spell] = field(default_factory=list)
    keys: dict[str, KeyRule] = field(default_factory=dict)

    def update(self, changes: dict[str, Any]) -> None:
        """Apply a partial JSON config; raise ``ConfigError`` naming what is wrong."""
        unknown = set(changes) - {f for f in asdict(self)}
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(sorted(unknown))}")
        new = copy.deepcopy(self)
        for key, value in changes.items():
            if key == "latency":
                new.latency = parse_latency(value)
            elif key == "content":
                if value not in CONTENT_MODES:
                    raise ConfigError(f"content must be one of {', '.join(CONTENT_MODES)}")
                new.content = value
            elif key == "fail_rates":
                new.fail_rates = parse_rates(value)
            elif key == "script":
                if not isinstance(value, list):
                    raise ConfigError("script must be a list of outcomes")
                new.script = [parse_outcome(str(v)) for v in value]
            elif key in ("retry_after", "hang_max", "batch_latency", "prompt_cache_ttl"):
                setattr(new, key, _nonneg(key, value))
            elif key == "seed":
                new.seed = None if value is None else int(value)
            elif key in ("limit_retry_after", "batch_expire"):
                if not isinstance(value, bool):
                    raise ConfigError(f"{key} must be true or false")
                setattr(new, key, value)
            elif key == "batch_result_faults":
                if not isinstance(value, list) or any(v not in RESULT_FAULTS for v in value):
                    raise ConfigError(
                        f"batch_result_faults is a list of {', '.join(RESULT_FAULTS)}"
                    )
                new.batch_result_faults = [str(v) for v in value]
            elif key in ("rpm", "tpm"):
                setattr(new, key, parse_limit(key, value))
            elif key == "spells":
                new.spells = parse_spells(value, time.monotonic())
            elif key == "keys":
                new.keys = parse_keys(value)
            elif key in ("fixed_text", "api_key"):
                setattr(new, key, None if value is None else str(value))
        self.__dict__.update(new.__dict__)

    def public(self) -> dict[str, Any]:
        data = asdict(self)
        data["latency"] = list(self.latency)
        data["api_key"] = "***" if self.api_key else None
        now = time.monotonic()
        data["spells"] = [s.public(now) for s in self.spells]
        data["keys"] = masked(self.keys)
        return data


def parse_latency(value: Any) -> tuple[float, float]:
    """``0.5``, ``"0.5"``, ``[0.2, 1.5]`` or ``"0.2:1.5"`` (uniform between the two)."""
    if isinstance(value, str):
        value = [float(v) for v in value.split(":")] if ":" in value else float(value)
    if isinstance(value, int | float):
        value = [value, value]
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ConfigError("latency must be seconds or [low, high]")
    low, high = _nonneg("latency", value[0]), _nonneg("latency", value[1])
    if high < low:
        raise ConfigError("latency: high is below low")
    return low, high


def parse_limit(name: str, value: Any) -> int | None:
    """A per-minute limit: a positive whole number, or null/0 for none."""
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a whole number per minute (or null for none)") from None
    if number < 0 or number != float(value):
        raise ConfigError(f"{name} must be a whole number per minute, not {value!r}")
    return number or None


def parse_outcome(item: str) -> str:
    """An outcome name, an alias (429, 500, invalid), a status (503), or ``429:SECONDS``."""
    name, _, arg = item.strip().partition(":")
    name = ALIASES.get(name, name)
    if name in OUTCOMES or (name.isdigit() and len(name) == 3):
        if arg:
            float(arg)  # a Retry-After for this one answer
            return f"{name}:{arg}"
        return name
    raise ConfigError(f"unknown outcome {item!r}: use {', '.join(OUTCOMES)} or a status code")


def parse_rates(value: Any) -> dict[str, float]:
    """``{"429": 0.1, "malformed": 0.05}`` or ``"429=0.1,malformed=0.05"``."""
    if isinstance(value, str):
        pairs = [p.split("=", 1) for p in value.split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise ConfigError("fail rates look like 429=0.1,malformed=0.05")
        value = {k: v for k, v in pairs}
    if not isinstance(value, dict):
        raise ConfigError("fail_rates must map outcomes to probabilities")
    rates = {parse_outcome(str(k)): float(v) for k, v in value.items()}
    if any(not 0 <= p <= 1 for p in rates.values()) or sum(rates.values()) > 1 + 1e-9:
        raise ConfigError("fail rates are probabilities that add up to at most 1")
    return rates


def _nonneg(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number of seconds") from None
    if number < 0:
        raise ConfigError(f"{name} must not be negative")
    return number
