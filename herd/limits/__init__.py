"""Fleet-wide provider limits (requests, tokens, concurrency per provider, model and key),
kept in the job store so every worker of a fleet shares them.

    limiter = limiter_for(app.broker)            # or for_broker("postgres", url)
    await limiter.open()
    scope = scope_name("openai", "gpt-4o-mini", key_id(api_key))
    async with hold(limiter, scope, Limit(rpm=600, tpm=200_000), tokens, holder=job) as slot:
        ...                                      # the call
        await slot.adjust(usage.total_tokens)   # reconcile the reservation
"""

from herd.errors import CapacityTimeout
from herd.limits.acquire import Slot, hold, hold_any
from herd.limits.base import (
    Grant,
    Limit,
    Limiter,
    LimitStats,
    Share,
    batch_scope,
    key_id,
    scope_name,
)
from herd.limits.config import LimitsFile, PoolKey, load
from herd.limits.postgres import PostgresLimiter
from herd.limits.redis import RedisLimiter
from herd.limits.registry import LIMITERS, for_broker, limiter_for
from herd.limits.tokens import estimate, estimate_input, estimate_output

__all__ = [
    "LIMITERS",
    "CapacityTimeout",
    "Grant",
    "Limit",
    "LimitStats",
    "Limiter",
    "LimitsFile",
    "PoolKey",
    "PostgresLimiter",
    "RedisLimiter",
    "Share",
    "Slot",
    "batch_scope",
    "estimate",
    "estimate_input",
    "estimate_output",
    "for_broker",
    "hold",
    "hold_any",
    "key_id",
    "limiter_for",
    "load",
    "scope_name",
]
