"""Anthropic's Messages API (``POST {base}/v1/messages``).

The base URL excludes the version prefix, as in Anthropic's SDKs:
``https://api.anthropic.com`` by default, or ``ANTHROPIC_BASE_URL``.

Structured output, by ``structured=``:

* ``"native"`` (default): ``output_config.format = {"type": "json_schema", ...}``,
  constrained decoding, the JSON comes back as the text block. Generally available
  on the Claude 4.5 models and later; older models answer 400, use ``"tool"``.
* ``"tool"``: one tool whose ``input_schema`` is the schema, forced with
  ``tool_choice``; the tool input comes back re-serialized as compact JSON text.
  Works on every Claude 3+ model; the schema's top level must be an object.

Prompt caching (``prompt_cache=True``, the default): a system prompt estimated at the
model's minimum cacheable length or more (1,024 tokens, 2,048 for Haiku) is sent as a
content block with a ``cache_control`` breakpoint of ``cache_ttl`` (``"5m"`` or
``"1h"``), so the system prompt and schema are written once and read by later calls at a
tenth of the input price. An evaluation's ``params`` may say ``"prompt_cache": false``.

Prefilling the assistant turn with ``{`` is not used: the newest models refuse it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Literal

from herd.llm.completion import RateLimitInfo, Timeouts, Usage
from herd.llm.errors import MissingAPIKey
from herd.llm.providers import promptcache
from herd.llm.providers.base import HTTPProvider, RetryPolicy, int_or_zero
from herd.llm.providers.ratelimits import anthropic_rate_limits

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
DEFAULT_MAX_TOKENS = 4096
TOOL_NAME = "record_result"


class Anthropic(HTTPProvider):
    """A Messages API client. The key comes from ``api_key`` or ``ANTHROPIC_API_KEY``.

    ``max_tokens`` (required by the API) defaults to 4096; ``params`` may override it.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        model: str,
        timeout: float | Timeouts | None = None,
        retry: RetryPolicy | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        structured: Literal["native", "tool"] = "native",
        version: str = API_VERSION,
        name: str = "anthropic",
        max_connections: int = 100,
        prompt_cache: bool = True,
        cache_ttl: Literal["5m", "1h"] = "5m",
    ) -> None:
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise MissingAPIKey("No Anthropic API key: pass api_key= or set ANTHROPIC_API_KEY.")
        if structured not in ("native", "tool"):
            raise ValueError(f"structured must be 'native' or 'tool', not {structured!r}")
        if cache_ttl not in promptcache.TTLS:
            raise ValueError(f"cache_ttl must be '5m' or '1h', not {cache_ttl!r}")
        super().__init__(
            name=name,
            model=model,
            base_url=base_url or os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL,
            api_key=key,
            timeout=timeout,
            retry=retry,
            max_connections=max_connections,
        )
        self.max_tokens = max_tokens
        self.structured = structured
        self.version = version
        self.prompt_cache = prompt_cache
        self.cache_ttl = cache_ttl

    def _request(
        self,
        system: str,
        user: str,
        schema: Mapping[str, Any] | None,
        params: Mapping[str, Any],
    ) -> tuple[str, dict[str, str], dict[str, Any]]:
        headers = {
            "content-type": "application/json",
            "x-api-key": self._api_key or "",
            "anthropic-version": self.version,
        }
        cache, params = promptcache.take_switch(params, self.prompt_cache)
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens}
        minimum = promptcache.anthropic_min_tokens(self.model)
        if cache and promptcache.long_enough(self.name, self.model, system, minimum):
            # The breakpoint ends the prefix cached: tools and system, before the document.
            body["system"] = [
                {
                    "type": "text",
                    "text": system,
                    "cache_control": {"type": "ephemeral", "ttl": self.cache_ttl},
                }
            ]
        elif system:
            body["system"] = system
        if schema is not None:
            if self.structured == "native":
                body["output_config"] = {"format": {"type": "json_schema", "schema": dict(schema)}}
            else:
                body["tools"] = [
                    {
                        "name": TOOL_NAME,
                        "description": "Record the result, following the input schema exactly.",
                        "input_schema": dict(schema),
                    }
                ]
                body["tool_choice"] = {"type": "tool", "name": TOOL_NAME}
        body.update(params)
        body["model"] = self.model  # the model priced: params do not choose another
        body["messages"] = [{"role": "user", "content": user}]
        body["stream"] = False
        return "/v1/messages", headers, body

    def _rate_limits(self, headers: Mapping[str, str]) -> RateLimitInfo | None:
        return anthropic_rate_limits(headers)

    def _parse(self, data: Any) -> tuple[str, Usage, str | None, str | None, str | None]:
        blocks = data["content"]
        if not isinstance(blocks, list):
            raise TypeError("content is not a list")
        tool = next((b for b in blocks if b.get("type") == "tool_use"), None)
        if tool is not None:
            text = json.dumps(tool["input"], ensure_ascii=False, separators=(",", ":"))
        else:
            text = "".join(b["text"] for b in blocks if b.get("type") == "text")
        usage = data.get("usage") or {}
        read = int_or_zero(usage.get("cache_read_input_tokens"))
        written = int_or_zero(usage.get("cache_creation_input_tokens"))
        return (
            text,
            Usage(
                # Anthropic's input_tokens are only those after the last breakpoint.
                input_tokens=int_or_zero(usage.get("input_tokens")) + read + written,
                output_tokens=int_or_zero(usage.get("output_tokens")),
                cached_input_tokens=read,
                cache_write_tokens=written,
            ),
            data.get("model"),
            data.get("stop_reason"),
            data.get("id"),
        )
