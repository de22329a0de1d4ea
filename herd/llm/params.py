"""What an evaluation's ``params`` may ask of a provider: an allow-list.

The params are merged into every request body of the evaluation, and the ledger
prices each call by the spec's model at standard rates for one answer's tokens. A
deny-list of what breaks that kept missing parameters that add billed work the ledger
never sees (``web_search_options``: a search per call; Anthropic's server tools in
``tools``: billed per use; ``modalities``/``audio``: audio output at audio rates), and
each provider adds more. So only ALLOWED params are sent: ones that steer sampling or
bound the answer and are billed as the answer's tokens. Anything else is refused,
with the reason for the ones known to matter (REFUSED).

Of the allowed, ``n`` and ``best_of`` must be 1 (every answer generated is billed,
one is read), the tokens one call may generate (``max_tokens``,
``max_completion_tokens``) are bounded by the setting ``HERD_EVAL_MAX_TOKENS``, and
``prompt_cache`` (true/false) is herd's own: whether the provider's prompt cache is
asked for (herd.llm.providers.promptcache); it is not sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from herd.errors import InvalidInput

# Sampling and bounds: they change which tokens come back, not what is billed for them.
ALLOWED = frozenset({
    "temperature", "top_p", "top_k", "seed", "stop", "stop_sequences", "presence_penalty",
    "frequency_penalty", "logit_bias", "max_tokens", "max_completion_tokens", "n",
    "best_of", "user", "prompt_cache",
})  # fmt: skip
# Why some known params are refused (anything not in ALLOWED is refused all the same).
REFUSED = {
    "model": "the spec's model is the one called and priced; set the model of the spec",
    "messages": "the spec's system prompt and the document make the messages",
    "system": "the spec's system prompt is the one sent; set the system of the spec",
    "stream": "an evaluation reads one whole answer",
    "stream_options": "an evaluation reads one whole answer",
    "service_tier": "the ledger prices calls at the standard tier",
    "web_search_options": "a web search is billed per call, beyond the answer's tokens",
    "tools": "tools (Anthropic's server tools: web search, code execution) are billed per"
    " use beyond the answer's tokens, and the answer is the model's text",
    "tool_choice": "the answer is the model's text, not a tool call",
    "modalities": "audio output is billed at audio rates; the answer is the model's text",
    "audio": "audio output is billed at audio rates; the answer is the model's text",
    "response_format": "the spec's schema sets the response format; set the schema",
}
ONE = ("n", "best_of")  # answers generated (and billed) per call; one is read
TOKEN_LIMITS = ("max_tokens", "max_completion_tokens")


def check_params(params: Mapping[str, Any], *, max_tokens: int | None = None) -> None:
    """Refuse params outside the allow-list, or that change the fan-out of a call (see
    the module).

    ``max_tokens``: the bound (the setting ``eval_max_tokens``); None checks only that
    a token limit given is a positive integer.
    """
    if not isinstance(params, Mapping):
        raise InvalidInput(
            f"params must be a JSON object, not {type(params).__name__}", field="params"
        )
    for key, value in params.items():
        field = f"params.{key}"
        if key in REFUSED:
            raise InvalidInput(f"{field} is not allowed: {REFUSED[key]}", field=field)
        if key not in ALLOWED:
            raise InvalidInput(
                f"{field} is not allowed: evaluations send only {', '.join(sorted(ALLOWED))}"
                " (an allow-list: a parameter may add work the ledger cannot price)",
                field=field,
            )
        if key in ONE and (not _is_int(value) or value != 1):
            raise InvalidInput(
                f"{field} must be 1, not {value!r}: an evaluation reads one answer per call,"
                " and every answer generated is paid for",
                field=field,
            )
        if key == "prompt_cache" and not isinstance(value, bool):
            raise InvalidInput(
                f"{field} must be true or false, not {value!r} (herd reads it, never sends it)",
                field=field,
            )
        if key in TOKEN_LIMITS:
            if not _is_int(value) or value < 1:
                raise InvalidInput(
                    f"{field} must be a positive integer, not {value!r}", field=field
                )
            if max_tokens is not None and value > max_tokens:
                raise InvalidInput(
                    f"{field} is {value}; the limit is {max_tokens} (HERD_EVAL_MAX_TOKENS)",
                    field=field,
                )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
