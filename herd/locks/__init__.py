"""Fenced distributed locks, one API on Redis and on PostgreSQL.

Every lease carries a fencing token that grows strictly per lock name, across
holders and expiries; renew, release and check are refused once the lease is
stale, and ``PostgresLocks.assert_held`` fences a caller's SQL transaction.

    locks = PostgresLocks(url)          # or RedisLocks(url)
    async with locks, locks.hold("corpus:kjv", ttl=30, wait=5) as lease:
        ...                             # cancelled, then LeaseLost, if the lock is lost
"""

from herd.errors import LeaseLost, LockNotAcquired
from herd.locks.base import BaseLocks, LockLease, Locks
from herd.locks.postgres import PostgresLocks
from herd.locks.redis import RedisLocks

__all__ = [
    "BaseLocks",
    "LeaseLost",
    "LockLease",
    "LockNotAcquired",
    "Locks",
    "PostgresLocks",
    "RedisLocks",
]
