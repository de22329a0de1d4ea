"""The lock stores herd knows, by the name of the store they live in ("postgres",
"redis": the ``HERD_CACHE`` the exact cache's singleflight uses). One table; a new
lock store is one ``register`` call."""

from __future__ import annotations

from typing import Protocol

from herd.errors import ConfigError
from herd.locks.base import BaseLocks
from herd.locks.postgres import PostgresLocks
from herd.locks.redis import RedisLocks


class LocksFactory(Protocol):
    def __call__(self, url: str, /, *, poll_interval: float = ...) -> BaseLocks: ...


LOCKS: dict[str, LocksFactory] = {
    "postgres": PostgresLocks,
    "redis": RedisLocks,
}


def register(name: str, factory: LocksFactory) -> None:
    LOCKS[name] = factory


def locks_for(name: str, url: str, *, poll_interval: float = 0.2) -> BaseLocks:
    """Unopened locks of the store ``name`` at ``url``."""
    try:
        factory = LOCKS[name]
    except KeyError:
        raise ConfigError(f"no lock store {name!r}: use {' or '.join(LOCKS)}") from None
    return factory(url, poll_interval=poll_interval)
