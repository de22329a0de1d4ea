"""The servers herd's own suite, chaos runs and benchmarks start: Redis Stack
(``redis_stack``), a Redis Cluster of them (``redis_cluster``) and PgBouncer
(``pgbouncer``); PostgreSQL is ``herd.embedded``. Needs the ``test`` extra; nothing
on herd's default path imports this package.
"""
