"""The simulator's provider prompt cache, as the two APIs document theirs.

The shared prefix of a call is its system prompt with the schema it asks for (and
Anthropic's tools): what every call of one evaluation sends before its document.

* OpenAI caches by itself: a prefix of 1,024 estimated tokens or more is cached in
  128-token steps; the first call writes it (at no premium, reported as nothing), a
  repeat within the lifetime reports ``prompt_tokens_details.cached_tokens``.
* Anthropic caches only up to a ``cache_control`` breakpoint (read here on the system
  prompt's content blocks), and only a prefix of the model's minimum or more (1,024
  tokens, 2,048 for Haiku): the first call reports ``cache_creation_input_tokens``, a
  repeat ``cache_read_input_tokens``; ``input_tokens`` are the rest.

Entries are per API key, model and prefix, and live ``prompt_cache_ttl`` seconds (the
5-minute lifetime; ``"ttl": "1h"`` lives twelve times that), refreshed by each read,
as the providers do. At most ``MAX_ENTRIES`` are kept; the oldest go first.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any

from herd.testing.simulator.content import estimate_tokens, text_of

OPENAI_MIN = 1024
OPENAI_STEP = 128
ANTHROPIC_MIN = 1024
ANTHROPIC_HAIKU_MIN = 2048
HOUR_FACTOR = 12  # a "1h" entry lives 12 x the 5-minute lifetime
MAX_ENTRIES = 100_000
MAX_KEYS_SEEN = 1000  # distinct prompt_cache_key values listed in /_sim/stats


def prefix(api: str, model: str, body: dict[str, Any]) -> tuple[str, int, int] | None:
    """The cacheable prefix of a call: (its id, its tokens, lifetime factor); None when
    the call has none the provider would cache."""
    if api == "openai":
        text = "\n".join(
            text_of(m.get("content"))
            for m in body.get("messages") or []
            if isinstance(m, dict) and m.get("role") in ("system", "developer")
        )
        tokens = estimate_tokens(text)
        if tokens < OPENAI_MIN:
            return None
        tokens -= tokens % OPENAI_STEP
        return _id(text, body.get("response_format"), body.get("tools")), tokens, 1
    system = body.get("system")
    if not isinstance(system, list):
        return None
    marked = [i for i, b in enumerate(system) if isinstance(b, dict) and b.get("cache_control")]
    if not marked:
        return None
    upto = system[: marked[-1] + 1]
    marked_text = text_of(upto)
    tokens = estimate_tokens(marked_text)
    if tokens < (ANTHROPIC_HAIKU_MIN if "haiku" in model.lower() else ANTHROPIC_MIN):
        return None  # the API ignores a breakpoint on a prefix this short
    control = upto[-1]["cache_control"]
    factor = HOUR_FACTOR if isinstance(control, dict) and control.get("ttl") == "1h" else 1
    schema = (body.get("output_config") or {}).get("format") or body.get("output_format")
    return _id(marked_text, schema, body.get("tools")), tokens, factor


class PromptCache:
    """Cached prefixes: (key id, model, prefix id) -> expiry, oldest first."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str, str], float] = OrderedDict()

    def use(self, entry: tuple[str, str, str], lifetime: float, now: float) -> bool:
        """True when ``entry`` was cached and alive (a read), else it is written now;
        either way it lives ``lifetime`` seconds from now."""
        expiry = self._entries.pop(entry, None)
        hit = expiry is not None and expiry > now
        self._entries[entry] = now + lifetime
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return hit

    def __len__(self) -> int:
        return len(self._entries)


def _id(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()
