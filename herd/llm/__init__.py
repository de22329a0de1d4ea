"""LLM calls for herd: providers over httpx, their errors, usage and cost.

The provider simulator lives in ``herd.testing.simulator`` (``herd.llm.simulator`` is an
alias for one release).
"""

from herd.llm.completion import Completion, RateLimitInfo, Timeouts, Usage
from herd.llm.errors import (
    MissingAPIKey,
    ProviderAuthError,
    ProviderError,
    ProviderResponseInvalid,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimited,
)
from herd.llm.pricing import DEFAULT_PRICES, Price, PriceTable, cost
from herd.llm.providers import (
    Anthropic,
    HTTPProvider,
    OpenAICompatible,
    Provider,
    RetryPolicy,
    parse_retry_after,
)

__all__ = [
    "DEFAULT_PRICES",
    "Anthropic",
    "Completion",
    "HTTPProvider",
    "MissingAPIKey",
    "OpenAICompatible",
    "Price",
    "PriceTable",
    "Provider",
    "ProviderAuthError",
    "ProviderError",
    "ProviderResponseInvalid",
    "ProviderTimeout",
    "ProviderUnavailable",
    "RateLimitInfo",
    "RateLimited",
    "RetryPolicy",
    "Timeouts",
    "Usage",
    "cost",
    "parse_retry_after",
]
