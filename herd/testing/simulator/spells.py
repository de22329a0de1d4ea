"""Outages and keys: a model overloaded or down for a time, keys with limits of their own.

A **spell** (``spells`` in ``/_sim/config``) makes one model (or every model: ``"*"``)
answer an error status for a while: ``{"model": "m", "status": 529, "for": 60,
"after": 0, "rate": 1.0}``; ``after`` and ``for`` are seconds from when the config is
posted, ``rate`` the share of the calls in the spell that fail (1: the model is down).
The error is each provider's documented one: Anthropic's 529 ``overloaded_error``
("Overloaded"), 500 ``api_error``, and for OpenAI's wire 503 "The server is overloaded
or not ready yet." and 500/502 ``server_error``, with no ``retry-after`` (neither
provider sends one with them), so a client's own backoff applies. A spell comes after
the key check and the rate limits, before the script and the failure draws; calls it
fails are not billed. Batch API requests are not touched by spells.

**Keys** (``keys``): per API key, limits of its own (``rpm``, ``tpm``: the key gets its
own buckets at those sizes instead of the simulator's) or a refusal (``"refused":
true``: 401 ``authentication_error`` naming the key, as a revoked key gets). Every key
already has buckets of its own per model (limits.py); this sets their size per key.
``/_sim/config`` shows the keys masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from herd.errors import ConfigError

STATUSES = (500, 502, 503, 529)
OPENAI_MESSAGES = {503: "The server is overloaded or not ready yet."}


@dataclass(frozen=True)
class Spell:
    model: str  # "*": every model
    status: int
    start: float  # monotonic seconds
    end: float
    rate: float = 1.0

    def covers(self, model: str, now: float) -> bool:
        return self.model in ("*", model) and self.start <= now < self.end

    def public(self, now: float) -> dict[str, Any]:
        return {"model": self.model, "status": self.status, "rate": self.rate,
                "starts_in": max(0.0, round(self.start - now, 3)),
                "ends_in": max(0.0, round(self.end - now, 3))}  # fmt: skip


@dataclass(frozen=True)
class KeyRule:
    rpm: int | None = None
    tpm: int | None = None
    refused: bool = False


def parse_spells(value: Any, now: float) -> list[Spell]:
    """``[{"model", "status", "for", "after", "rate"}, …]`` with times from ``now``."""
    if not isinstance(value, list):
        raise ConfigError("spells must be a list of {model, status, for, after, rate}")
    spells = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise ConfigError(f"spells[{i}] must be an object")
        unknown = set(item) - {"model", "status", "for", "after", "rate"}
        if unknown:
            raise ConfigError(f"spells[{i}]: unknown keys {', '.join(sorted(unknown))}")
        status = item.get("status", 529)
        if status not in STATUSES:
            raise ConfigError(f"spells[{i}].status must be one of {STATUSES}")
        model = item.get("model", "*")
        if not isinstance(model, str) or not model:
            raise ConfigError(f"spells[{i}].model must be a model name or '*'")
        seconds = _seconds(item.get("for"), f"spells[{i}].for")
        after = _seconds(item.get("after", 0), f"spells[{i}].after")
        rate = item.get("rate", 1.0)
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise ConfigError(f"spells[{i}].rate must be a probability (0 to 1)")
        spells.append(Spell(model, int(status), now + after, now + after + seconds, float(rate)))
    return spells


def parse_keys(value: Any) -> dict[str, KeyRule]:
    """``{"KEY": {"rpm": 10, "tpm": 1000, "refused": false}, …}``."""
    if not isinstance(value, dict):
        raise ConfigError("keys must map API keys to {rpm, tpm, refused}")
    rules = {}
    for key, rule in value.items():
        if not isinstance(rule, dict) or set(rule) - {"rpm", "tpm", "refused"}:
            raise ConfigError("keys: each key maps to an object of rpm, tpm, refused")
        limits: dict[str, int | None] = {}
        for name in ("rpm", "tpm"):
            raw = rule.get(name)
            if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int) or raw < 1):
                raise ConfigError(f"keys: {name} must be a positive whole number per minute")
            limits[name] = raw
        refused = rule.get("refused", False)
        if not isinstance(refused, bool):
            raise ConfigError("keys: refused must be true or false")
        rules[str(key)] = KeyRule(limits["rpm"], limits["tpm"], refused)
    return rules


def spell_on(spells: list[Spell], model: str, now: float) -> Spell | None:
    """The first spell over ``model`` at ``now``."""
    return next((s for s in spells if s.covers(model, now)), None)


def error_of(api: str, status: int) -> tuple[str, str]:
    """(error type, message) of ``status`` in ``api``'s wire format."""
    if api == "anthropic":
        return (
            ("overloaded_error", "Overloaded")
            if status == 529
            else ("api_error", "Internal server error")
        )
    return "server_error", OPENAI_MESSAGES.get(
        status, "The server had an error while processing your request."
    )


def masked(keys: dict[str, KeyRule]) -> dict[str, Any]:
    """The key rules for /_sim/config: each key shown by its last four characters."""
    return {f"***{k[-4:]}": {"rpm": r.rpm, "tpm": r.tpm, "refused": r.refused}
            for k, r in keys.items()}  # fmt: skip


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a number of seconds")
    if value < 0:
        raise ConfigError(f"{name} must not be negative")
    return float(value)
