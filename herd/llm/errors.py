"""The exceptions of the model providers, named for the fact they report.

Like ``herd.errors``, a class's docstring is its default message. httpx errors
are translated into these at the provider boundary; an API key never appears in
their messages, attributes or reprs (bodies are redacted before they are kept).
"""

from __future__ import annotations

from herd.errors import ConfigError, HerdError


class MissingAPIKey(ConfigError):  # noqa: N818 - named for the fact, like herd.errors
    """No API key: set the provider's key variable (ANTHROPIC_API_KEY, OPENAI_API_KEY)."""


class ProviderError(HerdError):
    """The model provider's call failed."""

    def __init__(
        self,
        message: str | None = None,
        *,
        provider: str | None = None,
        model: str | None = None,
        status: int | None = None,
        body: str | None = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.model = model
        self.status = status  # HTTP status of the last answer, None when there was none
        self.body = body  # a short, redacted excerpt of the last answer's body
        self.attempts = attempts


class ProviderAuthError(ProviderError):
    """The model provider refused the API key (401/403); check the key and its permissions."""


class RateLimited(ProviderError):  # noqa: N818 - the fact reported, like LeaseLost
    """The model provider answered 429 Too Many Requests; retry later."""

    def __init__(
        self,
        message: str | None = None,
        *,
        retry_after: float | None = None,
        scope: str | None = None,
        provider: str | None = None,
        model: str | None = None,
        status: int | None = 429,
        body: str | None = None,
        attempts: int = 1,
    ) -> None:
        super().__init__(
            message, provider=provider, model=model, status=status, body=body, attempts=attempts
        )
        self.retry_after = retry_after  # seconds the provider asked to wait, when it said
        # The limit that ran out, from the rate-limit headers: "requests", "tokens", or None
        # when the answer did not say.
        self.scope = scope


class ProviderTimeout(ProviderError):
    """The model provider did not answer in time."""


class ProviderUnavailable(ProviderError):
    """The model provider could not be reached; check the base URL and the network."""


class ProviderResponseInvalid(ProviderError):
    """The model provider's answer is not in the wire format it should speak."""
