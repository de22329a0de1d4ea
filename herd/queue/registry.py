"""The job stores herd knows, by the name ``HERD_BROKER`` (or ``App(broker=)``) gives.

One table: each backend registers the factory that makes its broker from the
settings, and the App picks through it. A new job store is one ``register`` call.
"""

from __future__ import annotations

from collections.abc import Callable

from herd.config import Settings
from herd.errors import ConfigError
from herd.queue.base import Broker
from herd.queue.postgres import PostgresBroker
from herd.queue.redis import RedisBroker

# (settings, herd's PostgreSQL URL, asked only by a store that lives there (it may
# start the embedded server), the process's pool size) -> an unopened broker
BrokerFactory = Callable[[Settings, Callable[[], str], int], Broker]

BROKERS: dict[str, BrokerFactory] = {
    "postgres": PostgresBroker.from_settings,
    "redis": RedisBroker.from_settings,
}


def register(name: str, factory: BrokerFactory) -> None:
    BROKERS[name] = factory


def make_broker(settings: Settings, database_url: Callable[[], str], pool_size: int) -> Broker:
    """The unopened broker ``settings.broker`` names."""
    try:
        factory = BROKERS[settings.broker]
    except KeyError:
        raise ConfigError(
            f"unknown broker {settings.broker!r}: use {' or '.join(BROKERS)}"
        ) from None
    return factory(settings, database_url, pool_size)
