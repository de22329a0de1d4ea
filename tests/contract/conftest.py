"""The fixtures of every seam's contract suite, over every backend (backends.py)."""

from tests.contract.backends import cache_backend, limiter, lock_backend, scope  # noqa: F401
