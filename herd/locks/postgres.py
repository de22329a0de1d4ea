"""Fenced locks on PostgreSQL: one statement per verb, by the server's clock.

A lock is a row of ``herd_locks`` (migration 0003) that is never deleted:
release moves ``expires_at`` to -infinity, so the next holder's token is the
last one plus one, across holders and expiries alike. A holder's lock is taken
over only once ``expires_at <= now()``, or by its own owner with ``take_over``;
renew, release and check all name the token and require ``expires_at > now()``.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager
from typing import Any

from psycopg import AsyncConnection, sql
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

from herd.db import postgres as pgdb
from herd.db.queries import named
from herd.errors import LeaseLost
from herd.locks.base import BaseLocks, LockLease

Q = named("herd.locks.sql")
CHANNEL = "herd_locks"  # payload: the lock name; a hint for waiters


def translate_errors(where: str) -> AbstractContextManager[None]:
    return pgdb.translate_errors(where, store="the lock store")


def _params(lease: LockLease) -> dict[str, Any]:
    return {"name": lease.name, "token": lease.token, "ttl": lease.ttl}


class PostgresLocks(BaseLocks):
    """Fenced locks on PostgreSQL. Give a URL (the process's pool for it is joined
    on ``open()``, and herd.locks.sql migrated) or an ``AsyncConnectionPool`` you
    own and have opened and migrated.
    """

    def __init__(
        self,
        db: str | AsyncConnectionPool[Any],
        *,
        owner: str | None = None,
        poll_interval: float = 0.2,
        pool_size: int = 4,
        auto_migrate: bool = True,
        direct_url: str | None = None,
    ) -> None:
        super().__init__(owner=owner, poll_interval=poll_interval)
        self.auto_migrate = auto_migrate
        self._listen_kwargs: dict[str, Any] = {}
        self._shared: pgdb.SharedPool | None = None
        self._pool: pgdb.SharedPool | AsyncConnectionPool[Any]
        if isinstance(db, str):
            self.url = self._where = db
            self._pool = self._shared = pgdb.SharedPool(
                db, max_size=pool_size, store="the lock store", direct_url=direct_url
            )
            self._owns_pool = True
        else:
            # Only a plain conninfo lets us open the listening connection;
            # without it, waiters still find releases by polling.
            conninfo, kwargs = db.conninfo, db.kwargs
            self.url = conninfo if isinstance(conninfo, str) else ""
            self._where = "the given connection pool"  # its conninfo may hold a password
            self._listen_kwargs = kwargs if isinstance(kwargs, dict) else {}
            self._pool = db
            self._owns_pool = False

    async def open(self) -> None:
        if self._shared is not None:
            await self._shared.open("herd.locks.sql" if self.auto_migrate else None)

    async def close(self) -> None:
        await super().close()
        if self._shared is not None:
            await self._shared.close()

    async def _one(self, query: str, params: dict[str, Any]) -> tuple[Any, ...] | None:
        with translate_errors(self._where):
            async with self._pool.connection() as conn:
                cur = await conn.execute(query, params)
                row: tuple[Any, ...] | None = await cur.fetchone()
                return row

    async def _try_acquire(
        self, name: str, ttl: float, owner: str, take_over: bool = False
    ) -> int | None:
        row = await self._one(
            Q["acquire"], {"name": name, "owner": owner, "ttl": ttl, "take_over": take_over}
        )
        return int(row[0]) if row else None

    async def renew(self, lease: LockLease) -> bool:
        return await self._one(Q["renew"], _params(lease)) is not None

    async def release(self, lease: LockLease) -> bool:
        return await self._one(Q["release"], {**_params(lease), "channel": CHANNEL}) is not None

    async def check(self, lease: LockLease) -> bool:
        return await self._one(Q["check"], _params(lease)) is not None

    async def assert_held(self, conn: AsyncConnection[Any], lease: LockLease) -> None:
        """Fence the caller's transaction on ``conn`` with ``lease``; LeaseLost if stale.

        Takes a share lock on the lock row while it still carries the lease's
        token and has not expired. No takeover can then commit before the
        caller's transaction ends, so the writes made after this call on the
        same transaction commit only if ``lease`` held the lock throughout::

            async with pool.connection() as conn, conn.transaction():
                await locks.assert_held(conn, lease)
                await conn.execute("INSERT ... ON CONFLICT ... DO UPDATE ...")

        The holder's own renewals wait for that transaction too: keep it well
        inside the ttl, or ``hold()`` counts the lease as lost. ``conn`` must be
        in a transaction (``conn.transaction()``, or a connection not in
        autocommit mode); otherwise the share lock would end with this
        statement and fence nothing (ValueError).
        """
        with translate_errors(self._where):
            cur = await conn.execute(Q["assert_held"], _params(lease))
            row = await cur.fetchone()
        if conn.info.transaction_status != TransactionStatus.INTRANS:
            raise ValueError("assert_held() must run inside a transaction to fence anything")
        if row is None:
            raise LeaseLost(
                f"lock {lease.name!r} (token {lease.token}) is no longer held; write refused"
            )

    async def _listen(self) -> None:
        if self._shared is not None:
            # The process's one LISTEN connection, shared with the broker's.
            listener = self._shared.listener
            listener.subscribe(CHANNEL, self._wake)
            try:
                await asyncio.Event().wait()
            finally:
                listener.unsubscribe(CHANNEL, self._wake)
        if not self.url:
            return await super()._listen()
        kwargs = {**self._listen_kwargs, "autocommit": True}
        conn = await AsyncConnection.connect(self.url, **kwargs)
        async with conn:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
            async for note in conn.notifies():
                self._wake(note.payload)
