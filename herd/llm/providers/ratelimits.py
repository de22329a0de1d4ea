"""The providers' rate-limit headers, read into a ``RateLimitInfo``.

OpenAI (and servers that copy it) sends ``x-ratelimit-{limit,remaining,reset}-{requests,
tokens}``, the resets as Go-style durations (``"1s"``, ``"6m0s"``, ``"120ms"``,
``"1h2m3.5s"``). Anthropic sends ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,
reset}``, the resets as RFC 3339 instants (``tokens`` is the tightest token limit in force,
so the input- and output-token headers add nothing here). A header that is missing or
cannot be read is left out (``None``): a provider's odd header never fails a call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime

from herd.llm.completion import RateLimitInfo

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def parse_duration(text: str | None) -> float | None:
    """Seconds of a Go duration (``"6m0s"``, ``"1.5s"``, ``"120ms"``), or of a bare number."""
    if text is None:
        return None
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        return value if value >= 0 and value == value and value != float("inf") else None
    if not text or _DURATION.sub("", text):  # anything left over: not a duration
        return None
    return sum(float(n) * _UNIT[u] for n, u in _DURATION.findall(text))


def parse_instant(text: str | None, now: datetime | None = None) -> float | None:
    """Seconds from ``now`` until an RFC 3339 instant (0 if it has passed)."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _count(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def _or_none(info: RateLimitInfo) -> RateLimitInfo | None:
    return None if info == RateLimitInfo() else info


def openai_rate_limits(headers: Mapping[str, str]) -> RateLimitInfo | None:
    h = {k.lower(): v for k, v in headers.items()}
    return _or_none(
        RateLimitInfo(
            requests_limit=_count(h.get("x-ratelimit-limit-requests")),
            requests_remaining=_count(h.get("x-ratelimit-remaining-requests")),
            requests_reset=parse_duration(h.get("x-ratelimit-reset-requests")),
            tokens_limit=_count(h.get("x-ratelimit-limit-tokens")),
            tokens_remaining=_count(h.get("x-ratelimit-remaining-tokens")),
            tokens_reset=parse_duration(h.get("x-ratelimit-reset-tokens")),
        )
    )


def anthropic_rate_limits(
    headers: Mapping[str, str], now: datetime | None = None
) -> RateLimitInfo | None:
    h = {k.lower(): v for k, v in headers.items()}
    p = "anthropic-ratelimit-"
    return _or_none(
        RateLimitInfo(
            requests_limit=_count(h.get(p + "requests-limit")),
            requests_remaining=_count(h.get(p + "requests-remaining")),
            requests_reset=parse_instant(h.get(p + "requests-reset"), now),
            tokens_limit=_count(h.get(p + "tokens-limit")),
            tokens_remaining=_count(h.get(p + "tokens-remaining")),
            tokens_reset=parse_instant(h.get(p + "tokens-reset"), now),
        )
    )
