"""The semantic cache that herd's commands use, on the backend the settings choose.

HERD_CACHE=redis puts it on HERD_REDIS_URL (a Redis Stack server: it needs the
search module); otherwise it lives in the database in use, with pgvector.
"""

from __future__ import annotations

from typing import Any

from herd.app import App
from herd.errors import ConfigError
from herd.semantic.base import SemanticStore
from herd.semantic.cache import SemanticCache

QUERY_CACHE = "rag"  # the name of the cache in front of `herd query`


def store_for(app: App) -> SemanticStore:
    if app.settings.cache == "redis":
        if not app.settings.redis_url:
            raise ConfigError("HERD_CACHE=redis needs HERD_REDIS_URL")
        from herd.semantic.redis import RedisSemanticStore

        return RedisSemanticStore(app.settings.redis_url)
    from herd.semantic.postgres import PostgresSemanticStore

    return PostgresSemanticStore(app.database_url())


async def query_cache(app: App, embedder: Any, *, tenant: str = "default") -> SemanticCache:
    """An open cache for `herd query`'s retrievals, closed with the app."""
    cache = SemanticCache(store_for(app), embedder=embedder, name=QUERY_CACHE, tenant=tenant)
    await cache.open()
    app.on_close(cache.close)
    return cache


async def backend_stats(app: App) -> dict[str, dict[str, Any]]:
    """Every semantic cache's figures, by name (no embedder needed)."""
    from herd.semantic.stats import summarize

    store = store_for(app)
    await store.open(None)
    try:
        return {name: summarize(raw) for name, raw in sorted((await store.read_stats()).items())}
    finally:
        await store.close()


async def backend_clear(app: App, *, name: str | None, collection: str | None) -> int:
    store = store_for(app)
    await store.open(None)
    try:
        return await store.clear(name, collection)
    finally:
        await store.close()
