"""The limit stores herd knows, by the name of the job store they live in: a fleet's
workers share its limits through the store that already holds its jobs. One table;
a new limit store is one ``register`` call."""

from __future__ import annotations

from collections.abc import Callable

from herd.limits.base import Limiter
from herd.limits.postgres import PostgresLimiter
from herd.limits.redis import RedisLimiter
from herd.queue.base import Broker

LIMITERS: dict[str, Callable[[str], Limiter]] = {
    "postgres": PostgresLimiter,
    "redis": RedisLimiter,
}


def register(name: str, factory: Callable[[str], Limiter]) -> None:
    LIMITERS[name] = factory


def for_broker(broker_name: str, url: str) -> Limiter:
    """The unopened limiter that lives in the job store ``broker_name`` at ``url``."""
    try:
        factory = LIMITERS[broker_name]
    except KeyError:
        raise ValueError(
            f"no limiter for broker {broker_name!r}; expected one of {', '.join(LIMITERS)}"
        ) from None
    return factory(url)


def limiter_for(broker: Broker) -> Limiter:
    """The unopened limiter that shares ``broker``'s store."""
    return for_broker(broker.name, broker.url)
