"""Model providers over plain httpx: OpenAI-compatible servers and Anthropic."""

from herd.llm.providers.anthropic import Anthropic
from herd.llm.providers.base import (
    HTTPProvider,
    Provider,
    RetryPolicy,
    parse_retry_after,
)
from herd.llm.providers.openai import OpenAICompatible
from herd.llm.providers.ratelimits import (
    anthropic_rate_limits,
    openai_rate_limits,
    parse_duration,
)

__all__ = [
    "Anthropic",
    "HTTPProvider",
    "OpenAICompatible",
    "Provider",
    "RetryPolicy",
    "anthropic_rate_limits",
    "openai_rate_limits",
    "parse_duration",
    "parse_retry_after",
]
