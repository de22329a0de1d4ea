"""Provider prompt caching: what marks a shared prefix, and whether it is long enough.

An evaluation sends the same system prompt and schema before every document, so the
request puts them first and the document last. Anthropic caches a prefix that ends
at a ``cache_control`` breakpoint, if the prefix is at least the model's minimum
(shorter ones are silently not cached); OpenAI caches prefixes of 1,024 tokens and
more by itself, and routes requests of one ``prompt_cache_key`` to the same cache.
Neither changes herd's own cache key (herd.cache.canonical_key): the answer does
not depend on where the provider read the prompt from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from herd.limits.tokens import estimate_input

PARAM = "prompt_cache"  # an evaluation's params key herd reads and never sends
TTLS = ("5m", "1h")
OPENAI_MIN_TOKENS = 1024
ANTHROPIC_MIN_TOKENS = 1024  # Sonnet and Opus
ANTHROPIC_HAIKU_MIN_TOKENS = 2048


def anthropic_min_tokens(model: str) -> int:
    """The shortest prefix Anthropic caches for ``model``."""
    return ANTHROPIC_HAIKU_MIN_TOKENS if "haiku" in model.lower() else ANTHROPIC_MIN_TOKENS


def long_enough(provider: str, model: str, system: str, minimum: int) -> bool:
    """Whether the system prompt alone is estimated at ``minimum`` tokens or more (the
    estimate errs high: at worst a breakpoint the API ignores)."""
    return bool(system) and estimate_input(provider, model, system, "") >= minimum


def prefix_key(system: str, schema: Mapping[str, Any] | None) -> str:
    """A short stable id of the shared prefix (system prompt and schema), for OpenAI's
    ``prompt_cache_key``: calls of one evaluation spec share it, whatever the document."""
    text = json.dumps([system, schema], sort_keys=True, separators=(",", ":"), default=str)
    return "herd-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def take_switch(params: Mapping[str, Any], default: bool) -> tuple[bool, dict[str, Any]]:
    """The params' ``prompt_cache`` switch (``default`` without one) and the params to send."""
    rest = dict(params)
    value = rest.pop(PARAM, default)
    return bool(value), rest
