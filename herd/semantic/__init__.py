"""The semantic query cache: answers for queries close enough to ones already answered.

``SemanticCache`` holds the policy (threshold, near-miss guards, TTL, singleflight
through herd.cache's ExactCache, figures); ``RedisSemanticStore`` (Redis Stack,
HNSW) and ``PostgresSemanticStore`` (pgvector, HNSW) store the entries.
"""

from herd.semantic.base import Candidate, NewEntry, Scope, SemanticStore, similarity
from herd.semantic.cache import SemanticCache, SemanticHit, normalize_query
from herd.semantic.guards import Signature, agree, signature
from herd.semantic.postgres import PostgresSemanticStore
from herd.semantic.redis import RedisSemanticStore

__all__ = [
    "Candidate",
    "NewEntry",
    "PostgresSemanticStore",
    "RedisSemanticStore",
    "Scope",
    "SemanticCache",
    "SemanticHit",
    "SemanticStore",
    "Signature",
    "agree",
    "normalize_query",
    "signature",
    "similarity",
]
