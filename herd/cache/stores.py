"""The exact cache's store and locks where the settings put them, opened.

HERD_CACHE=redis puts both on HERD_REDIS_URL; otherwise they live in herd's
PostgreSQL (HERD_DATABASE_URL, or the embedded server).
"""

from __future__ import annotations

from herd.cache.base import CacheStore
from herd.cache.postgres import PostgresCacheStore
from herd.cache.redis import RedisCacheStore
from herd.config import Settings
from herd.errors import ConfigError
from herd.locks import PostgresLocks, RedisLocks
from herd.locks.base import BaseLocks


async def open_cache_stores(
    settings: Settings, *, poll_interval: float = 0.2
) -> tuple[CacheStore, BaseLocks]:
    if settings.cache == "redis":
        if not settings.redis_url:
            raise ConfigError("HERD_CACHE=redis needs HERD_REDIS_URL")
        store: CacheStore = RedisCacheStore(settings.redis_url)
        locks: BaseLocks = RedisLocks(settings.redis_url, poll_interval=poll_interval)
    else:
        from herd.app import App  # the embedded server's URL when none is set

        url = App(settings=settings).database_url()
        store = PostgresCacheStore(url)
        locks = PostgresLocks(url, poll_interval=poll_interval)
    await store.open()
    try:
        await locks.open()
    except BaseException:
        await store.close()
        raise
    return store, locks
