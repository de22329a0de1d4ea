"""What a provider call returns, and how long it may take."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    """Tokens the provider reports for one call (0 when it reports none).

    ``input_tokens`` is all the input the provider counted, whether served from its
    prompt cache or not: OpenAI reports it so (``prompt_tokens``, of which
    ``prompt_tokens_details.cached_tokens`` were cached); Anthropic reports the three
    parts apart (``input_tokens`` after the last breakpoint, ``cache_read_input_tokens``,
    ``cache_creation_input_tokens``), which herd adds up. ``cached_input_tokens`` of them
    were read from the provider's cache, ``cache_write_tokens`` written to it.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def uncached_input_tokens(self) -> int:
        """Input neither read from nor written to the provider's cache."""
        return max(0, self.input_tokens - self.cached_input_tokens - self.cache_write_tokens)


@dataclass(frozen=True)
class RateLimitInfo:
    """The provider's rate-limit headers of one answer: a ``None`` is a figure it did not send.

    ``*_reset`` is in seconds from when the answer was read until that dimension's capacity
    is whole again (OpenAI sends a duration, Anthropic an RFC 3339 instant).
    """

    requests_limit: int | None = None
    requests_remaining: int | None = None
    requests_reset: float | None = None
    tokens_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset: float | None = None

    def exhausted(self) -> str | None:
        """The dimension with nothing left ("requests" or "tokens"; the later reset if both)."""
        empty = [
            (reset or 0.0, name)
            for name, remaining, reset in (
                ("requests", self.requests_remaining, self.requests_reset),
                ("tokens", self.tokens_remaining, self.tokens_reset),
            )
            if remaining is not None and remaining <= 0
        ]
        return max(empty)[1] if empty else None

    def refused_by(self) -> str | None:
        """On a 429: the dimension that refused. An empty one; else tokens when requests are
        left (the call asked more tokens than remain, which the headers cannot show)."""
        scope = self.exhausted()
        if scope is not None:
            return scope
        requests_left = self.requests_remaining is None or self.requests_remaining > 0
        if requests_left and self.tokens_limit is not None:
            return "tokens"
        if self.requests_remaining is not None and self.tokens_limit is None:
            return "requests"
        return None

    def reset_of(self, scope: str | None) -> float | None:
        if scope == "requests":
            return self.requests_reset
        if scope == "tokens":
            return self.tokens_reset
        return None


@dataclass(frozen=True)
class Completion:
    """One model answer.

    ``text`` is the answer exactly as the provider sent it: with a schema it should
    be JSON, but parsing and validating it is the caller's job. ``latency`` is the
    duration of the HTTP call that answered, ``elapsed`` the whole ``complete()``
    including earlier failed tries and the waits between them.
    """

    text: str
    usage: Usage
    model: str  # as the provider named it in the answer (often a dated snapshot)
    provider: str
    raw_status: int
    latency: float
    elapsed: float = 0.0
    attempts: int = 1
    finish_reason: str | None = None  # "stop", "length", "end_turn", "max_tokens", "tool_use"…
    response_id: str | None = None
    rate_limits: RateLimitInfo | None = None  # from the answer's headers, when it sent them


@dataclass(frozen=True)
class Timeouts:
    """Seconds allowed for each phase of one HTTP call (one try).

    ``read`` bounds the wait between two reads of the answer; a provider that does
    not stream sends nothing until it is done, so ``read`` is in practice the time
    allowed for the whole generation (LLM calls on long documents: 30-120 s).
    """

    connect: float = 10.0
    read: float = 300.0
    write: float = 60.0
    pool: float = 60.0  # waiting for a free connection of the client's pool

    @classmethod
    def of(cls, value: float | Timeouts | None) -> Timeouts:
        """A bare number sets the read timeout and keeps the other defaults."""
        if value is None:
            return cls()
        if isinstance(value, Timeouts):
            return value
        return cls(read=float(value))
