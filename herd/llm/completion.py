"""What a provider call returns, and how long it may take."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    """Tokens the provider reports for one call (0 when it reports none)."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


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
