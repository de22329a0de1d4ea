"""The exact cache's store and locks where the settings put them, opened.

HERD_CACHE=redis puts both on HERD_REDIS_URL; otherwise they live in herd's
PostgreSQL (HERD_DATABASE_URL, or the embedded server).
"""

from __future__ import annotations

from collections.abc import Callable

from herd.cache.base import CacheStore
from herd.cache.postgres import PostgresCacheStore
from herd.cache.redis import RedisCacheStore
from herd.config import Settings
from herd.errors import ConfigError
from herd.locks import PostgresLocks, RedisLocks
from herd.locks.base import BaseLocks


def cache_url(settings: Settings, database_url: Callable[[], str]) -> str:
    """Where the caches live: HERD_REDIS_URL under HERD_CACHE=redis, else herd's
    PostgreSQL (``database_url`` is asked only then: it may start the embedded server)."""
    if settings.cache == "redis":
        if not settings.redis_url:
            raise ConfigError("HERD_CACHE=redis needs HERD_REDIS_URL")
        return settings.redis_url
    return database_url()


def cache_stores(
    settings: Settings, *, database_url: str | None = None, poll_interval: float = 0.2
) -> tuple[CacheStore, BaseLocks]:
    """The store and locks the settings name, not yet opened. ``database_url``: herd's
    PostgreSQL as the caller resolved it (else from the settings)."""
    if settings.cache == "redis":
        if not settings.redis_url:
            raise ConfigError("HERD_CACHE=redis needs HERD_REDIS_URL")
        return RedisCacheStore(settings.redis_url), RedisLocks(
            settings.redis_url, poll_interval=poll_interval
        )
    if database_url is None:
        from herd.app import App  # the embedded server's URL when none is set

        database_url = App(settings=settings).database_url()
    return PostgresCacheStore(database_url), PostgresLocks(
        database_url, poll_interval=poll_interval
    )


async def open_cache_stores(
    settings: Settings, *, poll_interval: float = 0.2
) -> tuple[CacheStore, BaseLocks]:
    store, locks = cache_stores(settings, poll_interval=poll_interval)
    await store.open()
    try:
        await locks.open()
    except BaseException:
        await store.close()
        raise
    return store, locks
