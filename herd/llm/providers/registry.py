"""The model providers herd knows, by name: one table that the evaluation's runtime,
the CLI's choices and the API's schema all read.

A kind says how to build its synchronous client and its Batch API client, which
variable holds its key and whether a call can go without one (a local
OpenAI-compatible server needs none; OpenAI's own API does). A new provider, or a
test's stand-in for one, is one ``register`` call.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from herd.errors import InvalidInput
from herd.llm.errors import MissingAPIKey
from herd.llm.providers.anthropic import DEFAULT_MAX_TOKENS, Anthropic
from herd.llm.providers.anthropic_batch import AnthropicBatch
from herd.llm.providers.base import Provider, RetryPolicy
from herd.llm.providers.batch import BatchAPI
from herd.llm.providers.openai import DEFAULT_BASE_URL as OPENAI_URL
from herd.llm.providers.openai import OpenAICompatible
from herd.llm.providers.openai_batch import OpenAIBatch


@dataclass(frozen=True)
class ProviderKind:
    name: str
    key_variable: str
    base_url_variable: str
    default_base_url: str
    # (model, the most output tokens a call may ask for, retry policy, the API key or
    # None for the kind's variable's) -> client
    sync: Callable[[str, int, RetryPolicy | None, str | None], Provider]
    # (model, the API key or None for the kind's variable's) -> Batch API client
    batch: Callable[[str, str | None], BatchAPI] | None = None
    # The max_tokens the client sends when the params name none (the API requires one).
    default_max_tokens: int | None = None
    # Whether a server at this base URL can be called without a key.
    keyless: Callable[[str], bool] = lambda _url: False

    def base_url(self) -> str:
        return os.environ.get(self.base_url_variable) or self.default_base_url

    def endpoint(self) -> str | None:
        """The server answering for this kind, normalised, as the exact cache's key names
        it (herd.llm.eval.spec.EvalSpec.key): two servers serving one model name give
        different answers. None for the default public endpoint: its entries keep the key
        they had before the endpoint was part of it (the cache's answers were paid for)."""
        here = normalize_url(self.base_url())
        return None if here == normalize_url(self.default_base_url) else here

    def check_key(self) -> None:
        """Refuse, before anything is enqueued, a call that could only fail for want of
        a key: the variable unset (or empty) where the server needs one."""
        if os.environ.get(self.key_variable) or self.keyless(self.base_url()):
            return
        raise MissingAPIKey(
            f"{self.key_variable} is not set: the {self.name} provider at"
            f" {self.base_url()} needs a key (set it, or {self.base_url_variable} for a"
            " server that needs none)"
        )


def normalize_url(url: str) -> str:
    """``url`` without what does not change the server: case of scheme and host, the
    default port, credentials, a trailing slash."""
    try:
        u = httpx.URL(url.strip())
    except (httpx.InvalidURL, TypeError):
        return url.strip()  # not a URL: the text is the best name it has
    if not u.scheme or not u.host:
        return url.strip()
    port = "" if u.port is None else f":{u.port}"  # httpx drops the scheme's default
    path = u.path.rstrip("/")
    query = f"?{u.query.decode()}" if u.query else ""
    return f"{u.scheme.lower()}://{u.host.lower()}{port}{path}{query}"


def _openai(model: str, _max: int, retry: RetryPolicy | None, key: str | None) -> Provider:
    return OpenAICompatible(model=model, retry=retry, api_key=key)


def _anthropic(model: str, most: int, retry: RetryPolicy | None, key: str | None) -> Provider:
    # Anthropic needs a max_tokens: its default, unless the setting is lower.
    return Anthropic(
        model=model, max_tokens=min(DEFAULT_MAX_TOKENS, most), retry=retry, api_key=key
    )


def _not_openai(url: str) -> bool:
    return httpx.URL(url).host != httpx.URL(OPENAI_URL).host


_KINDS: dict[str, ProviderKind] = {}


def register(kind: ProviderKind) -> None:
    """Add a provider, or replace the one of that name."""
    _KINDS[kind.name] = kind


def names() -> tuple[str, ...]:
    return tuple(_KINDS)


def kind(name: str) -> ProviderKind:
    found = _KINDS.get(name)
    if found is None:
        raise InvalidInput(
            f"provider {name!r} is not known: use {' or '.join(_KINDS)}", field="provider"
        )
    return found


register(
    ProviderKind(
        "openai", "OPENAI_API_KEY", "OPENAI_BASE_URL", OPENAI_URL, _openai,
        batch=lambda model, key: OpenAIBatch(model=model, api_key=key), keyless=_not_openai,
    )
)  # fmt: skip
register(
    ProviderKind(
        "anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "https://api.anthropic.com",
        _anthropic, batch=lambda model, key: AnthropicBatch(model=model, api_key=key),
        default_max_tokens=DEFAULT_MAX_TOKENS,
    )
)  # fmt: skip
