"""Model providers over plain httpx: OpenAI-compatible servers and Anthropic."""

from herd.llm.providers.anthropic import Anthropic
from herd.llm.providers.base import (
    HTTPProvider,
    Provider,
    RetryPolicy,
    parse_retry_after,
)
from herd.llm.providers.openai import OpenAICompatible

__all__ = [
    "Anthropic",
    "HTTPProvider",
    "OpenAICompatible",
    "Provider",
    "RetryPolicy",
    "parse_retry_after",
]
