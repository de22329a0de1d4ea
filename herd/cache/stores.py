"""The exact cache's stores, by the name ``HERD_CACHE`` gives, and its locks, opened.

One table: each backend registers where it lives (a URL made from the settings) and
how its store is made; the singleflight's locks live in the same store
(herd.locks.registry, under the same name). HERD_CACHE=redis puts both on
HERD_REDIS_URL; otherwise they live in herd's PostgreSQL (HERD_DATABASE_URL, or the
embedded server).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from herd.cache.base import CacheStore
from herd.cache.postgres import PostgresCacheStore
from herd.cache.postgres import home as postgres_home
from herd.cache.redis import RedisCacheStore
from herd.cache.redis import home as redis_home
from herd.config import Settings
from herd.embedded import database_url as herd_database_url
from herd.errors import ConfigError
from herd.locks.base import BaseLocks
from herd.locks.registry import locks_for


@dataclass(frozen=True)
class CacheBackend:
    # (settings, herd's PostgreSQL URL, asked only by a store that lives there) -> its URL
    home: Callable[[Settings, Callable[[], str]], str]
    store: Callable[[str], CacheStore]


CACHES: dict[str, CacheBackend] = {
    "postgres": CacheBackend(postgres_home, PostgresCacheStore),
    "redis": CacheBackend(redis_home, RedisCacheStore),
}


def register(name: str, backend: CacheBackend) -> None:
    CACHES[name] = backend


def _backend(settings: Settings) -> CacheBackend:
    try:
        return CACHES[settings.cache]
    except KeyError:
        raise ConfigError(
            f"unknown cache {settings.cache!r} (HERD_CACHE): use {' or '.join(CACHES)}"
        ) from None


def cache_url(settings: Settings, database_url: Callable[[], str]) -> str:
    """Where the caches live (``database_url`` is asked only for herd's PostgreSQL:
    it may start the embedded server)."""
    return _backend(settings).home(settings, database_url)


def cache_stores(
    settings: Settings, *, database_url: str | None = None, poll_interval: float = 0.2
) -> tuple[CacheStore, BaseLocks]:
    """The store and locks the settings name, not yet opened. ``database_url``: herd's
    PostgreSQL as the caller resolved it (else from the settings)."""
    backend = _backend(settings)
    url = backend.home(
        settings, lambda: database_url if database_url is not None else herd_database_url(settings)
    )
    return backend.store(url), locks_for(settings.cache, url, poll_interval=poll_interval)


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
