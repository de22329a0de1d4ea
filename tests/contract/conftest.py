"""The fixtures of every seam's contract suite, over every backend (backends.py)."""

from tests.contract.backends import (  # noqa: F401
    cache_backend,
    limiter,
    lock_backend,
    milvus_server,
    scope,
    vector_store,
)
