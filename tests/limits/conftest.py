"""Fixtures of the limiter tests of one store: the contract suite's ``scope``."""

from tests.contract.backends import scope  # noqa: F401
