"""Caches that save money: an exact result cache with cross-process singleflight."""

from herd.cache.base import CacheStore, Entry
from herd.cache.exact import ExactCache, Lookup
from herd.cache.keys import canonical_key, normalize_document
from herd.cache.postgres import PostgresCacheStore
from herd.cache.redis import RedisCacheStore
from herd.errors import SingleflightTimeout

__all__ = [
    "CacheStore",
    "Entry",
    "ExactCache",
    "Lookup",
    "PostgresCacheStore",
    "RedisCacheStore",
    "SingleflightTimeout",
    "canonical_key",
    "normalize_document",
]
