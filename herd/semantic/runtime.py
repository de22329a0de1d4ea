"""The semantic cache that herd's commands use, on the backend the settings choose.

HERD_CACHE=redis puts it on HERD_REDIS_URL (a Redis Stack server: it needs the
search module); otherwise it lives in the database in use, with pgvector.
"""

from __future__ import annotations

import asyncio
from typing import Any

from herd.app import App
from herd.cache.stores import cache_url
from herd.semantic.base import SemanticStore
from herd.semantic.cache import SemanticCache
from herd.semantic.stats import summarize
from herd.semantic.stores import store_for_url

QUERY_CACHE = "rag"  # the name of the cache in front of `herd query`


def store_for(app: App) -> SemanticStore:
    return store_for_url(cache_url(app.settings, app.database_url))


async def query_cache(app: App, embedder: Any) -> SemanticCache:
    """The app's open cache for retrievals (one per app and embedder, closed with the
    app: a server answering many queries must not open a pool per request). Give
    the tenant per call."""
    key = f"semantic.query.{embedder.id}"
    cache = app.state.get(key)
    if cache is None:
        async with app.state.setdefault("semantic.lock", asyncio.Lock()):
            cache = app.state.get(key)
            if cache is None:
                cache = SemanticCache(
                    store_for(app),
                    embedder=embedder,
                    name=QUERY_CACHE,
                    mode=app.settings.semantic_mode,
                    error_bound=app.settings.semantic_error_bound,
                    max_entry_bytes=app.settings.semantic_max_entry_bytes,
                    same=same_top_hit,
                )
                await cache.open()
                app.on_close(cache.close)
                app.state[key] = cache
    assert isinstance(cache, SemanticCache)
    return cache


def same_top_hit(a: Any, b: Any) -> bool:
    """The bounded mode's check of a cached retrieval: the same first chunk (scores and
    the tail of the ranking move with the wording, the answer a reader gets does not)."""

    def top(value: Any) -> Any:
        hits = value.get("hits") if isinstance(value, dict) else None
        return hits[0].get("id") if hits and isinstance(hits[0], dict) else None

    return a == b or (top(a) is not None and top(a) == top(b))


async def _stats_store(app: App) -> SemanticStore:
    store = app.state.get("semantic.stats_store")
    if store is None:
        async with app.state.setdefault("semantic.lock", asyncio.Lock()):
            store = app.state.get("semantic.stats_store")
            if store is None:
                store = store_for(app)
                await store.open(None)
                app.on_close(store.close)
                app.state["semantic.stats_store"] = store
    found: SemanticStore = store
    return found


async def backend_stats(app: App) -> dict[str, dict[str, Any]]:
    """Every semantic cache's figures, by name (no embedder needed)."""
    # The dashboard asks every 2 s: one store for the app's life, not one per read.
    store = await _stats_store(app)
    return {name: summarize(raw) for name, raw in sorted((await store.read_stats()).items())}


async def backend_clear(app: App, *, name: str | None, collection: str | None) -> int:
    store = store_for(app)
    await store.open(None)
    try:
        return await store.clear(name, collection)
    finally:
        await store.close()
