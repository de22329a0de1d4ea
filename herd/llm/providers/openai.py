"""Any server that speaks OpenAI's chat-completions API.

OpenAI itself, vLLM, Ollama (``http://localhost:11434/v1``), the llama.cpp server
(``http://localhost:8080/v1``), a LiteLLM proxy, or herd's own simulator: the base URL
includes the version prefix (``.../v1``), as in OpenAI's SDKs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import httpx

from herd.llm.completion import RateLimitInfo, Timeouts, Usage
from herd.llm.providers import promptcache
from herd.llm.providers.base import HTTPProvider, RetryPolicy, int_or_zero
from herd.llm.providers.ratelimits import openai_rate_limits

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAICompatible(HTTPProvider):
    """A chat-completions client.

    The key comes from ``api_key`` or ``OPENAI_API_KEY``; without either no
    ``Authorization`` header is sent (local servers need none). The base URL comes
    from ``base_url``, ``OPENAI_BASE_URL``, or OpenAI's. With a ``schema``, the call
    asks for structured output (``response_format`` of type ``json_schema``, named
    after the schema's ``title``); ``strict=True`` asks OpenAI for constrained
    decoding, which needs ``additionalProperties: false`` and every property required
    in each object (OpenAI answers 400 otherwise). ``name`` labels the completions
    and the price lookup (``"vllm"``, ``"ollama"``…).

    OpenAI caches a prompt's first 1,024 tokens and more by itself; ``prompt_cache_key``
    (a hash of the system prompt and schema, the prefix every call of one evaluation
    shares) routes those calls to one cache. It is sent with ``prompt_cache_key=True``,
    or by default (None) only to OpenAI's own API: other servers may refuse a field they
    do not know. An evaluation's ``params`` may say ``"prompt_cache": false``.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        model: str,
        timeout: float | Timeouts | None = None,
        retry: RetryPolicy | None = None,
        strict: bool = True,
        name: str = "openai",
        max_connections: int = 100,
        prompt_cache_key: bool | None = None,
    ) -> None:
        super().__init__(
            name=name,
            model=model,
            base_url=base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL,
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or None,
            timeout=timeout,
            retry=retry,
            max_connections=max_connections,
        )
        self.strict = strict
        if prompt_cache_key is None:
            prompt_cache_key = httpx.URL(self.base_url).host == "api.openai.com"
        self.prompt_cache_key = prompt_cache_key

    def _request(
        self,
        system: str,
        user: str,
        schema: Mapping[str, Any] | None,
        params: Mapping[str, Any],
    ) -> tuple[str, dict[str, str], dict[str, Any]]:
        cache, params = promptcache.take_switch(params, self.prompt_cache_key)
        headers = {"content-type": "application/json"}
        key = self._api_key
        if key:
            headers["authorization"] = f"Bearer {key}"
        messages: list[dict[str, Any]] = []
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": user})
        body: dict[str, Any] = {"model": self.model}
        if schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": schema_name(schema),
                    "schema": dict(schema),
                    "strict": self.strict,
                },
            }
        if cache:
            body["prompt_cache_key"] = promptcache.prefix_key(system, schema)
        body.update(params)
        body["model"] = self.model  # the model priced: params do not choose another
        body["messages"] = messages
        body["stream"] = False
        return "/chat/completions", headers, body

    def _rate_limits(self, headers: Mapping[str, str]) -> RateLimitInfo | None:
        return openai_rate_limits(headers)

    def _parse(self, data: Any) -> tuple[str, Usage, str | None, str | None, str | None]:
        choice = data["choices"][0]
        message = choice["message"]
        text = message.get("content")
        if text is None:  # a refusal, or a tool call we did not ask for
            text = message.get("refusal") or ""
        if not isinstance(text, str):
            raise TypeError("message content is not a string")
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        if not isinstance(details, dict):
            details = {}
        return (
            text,
            Usage(
                input_tokens=int_or_zero(usage.get("prompt_tokens")),
                output_tokens=int_or_zero(usage.get("completion_tokens")),
                cached_input_tokens=int_or_zero(details.get("cached_tokens")),
            ),
            data.get("model"),
            choice.get("finish_reason"),
            data.get("id"),
        )


def schema_name(schema: Mapping[str, Any]) -> str:
    """OpenAI wants a name of ``[a-zA-Z0-9_-]{1,64}`` for a json_schema format."""
    title = schema.get("title")
    name = re.sub(r"[^a-zA-Z0-9_-]+", "_", title).strip("_")[:64] if isinstance(title, str) else ""
    return name or "result"
