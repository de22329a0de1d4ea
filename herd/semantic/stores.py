"""Which semantic store a URL names: one table, by URL scheme. A new backend is a
module implementing ``SemanticStore`` (``herd.semantic.base``) and an entry here."""

from __future__ import annotations

from collections.abc import Callable

from herd.errors import ConfigError
from herd.semantic.base import SemanticStore
from herd.semantic.postgres import PostgresSemanticStore
from herd.semantic.redis import RedisSemanticStore

STORES: dict[str, Callable[[str], SemanticStore]] = {
    "redis": RedisSemanticStore,  # Redis Stack (the search module)
    "rediss": RedisSemanticStore,
    "unix": RedisSemanticStore,
    "postgres": PostgresSemanticStore,  # pgvector
    "postgresql": PostgresSemanticStore,
}
DSN = "postgresql"  # what a libpq key=value string (no scheme) is


def store_for_url(url: str) -> SemanticStore:
    """The (unopened) semantic store at ``url``."""
    scheme = url.partition("://")[0] if "://" in url else DSN
    make = STORES.get(scheme)
    if make is None:
        raise ConfigError(f"a semantic cache lives on redis:// or postgresql://, not {url[:20]!r}")
    return make(url)
