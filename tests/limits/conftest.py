"""Fixtures of the limiter tests (tests/limits/support.py)."""

from tests.limits.support import limiter, scope  # noqa: F401
