"""Provider limits on PostgreSQL: a row per scope, one statement per verb.

An acquire is one call of ``herd_limit_acquire`` (migration 5001), which locks the
scope's row by its primary key, reads the server's clock after the lock, and takes
the request, the tokens and the slot together or nothing. Concurrency slots live
in the row (holder -> expiry), pruned by the acquire that finds them expired.
Rows unused for LIMIT_TTL are deleted by ``purge()`` in bounded batches: on open, then
in the background at most every PURGE_EVERY seconds, started by a call that asks for
capacity (never inside a read, so the dashboard's poll costs O(scopes)).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from psycopg.types.json import Jsonb

from herd.cache.retention import PURGE_EVERY, Periodic, in_batches
from herd.db import postgres as pgdb
from herd.db.queries import named
from herd.limits.base import (
    LIMIT_TTL,
    Grant,
    Limit,
    LimitStats,
    Share,
    ShareArgs,
    check_request,
    check_scope,
    pause_seconds,
    rates,
    stats_of,
)

STORE = "the limit store"
Q = named("herd.limits.sql")


class PostgresLimiter:
    """Limits in PostgreSQL. Give a URL: the process's pool for it is joined on
    ``open()`` and herd.limits.sql migrated (``auto_migrate``)."""

    name = "postgres"

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 4,
        auto_migrate: bool = True,
        ttl: float = LIMIT_TTL,
        direct_url: str | None = None,
        purge_every: float = PURGE_EVERY,
    ) -> None:
        self.url = url
        self.auto_migrate = auto_migrate
        self.ttl = ttl
        self._pool = pgdb.SharedPool(url, max_size=pool_size, store=STORE, direct_url=direct_url)
        self._purges = Periodic(self._purge_all, "provider limits", purge_every)

    def _errors(self) -> AbstractContextManager[None]:
        return pgdb.translate_errors(self.url, store=STORE)

    async def open(self) -> None:
        await self._pool.open("herd.limits.sql" if self.auto_migrate else None)
        await self.purge()
        self._purges.ran()

    async def close(self) -> None:
        await self._pool.close()

    async def __aenter__(self) -> PostgresLimiter:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self._errors():
            async with self._pool.connection() as conn:
                cur = await conn.execute(query, params)
                return await cur.fetchall() if cur.description else []

    async def try_acquire(
        self,
        scope: str,
        limit: Limit,
        tokens: int,
        holder: str,
        hold_for: float,
        share: Share | None = None,
    ) -> Grant:
        check_request(scope, limit, tokens, hold_for)
        self._purges.due()
        req, tok = rates(limit)
        fair = ShareArgs.of(share, limit, tokens)
        ((granted, wait, at, reason),) = await self._run(
            Q["acquire"],
            {
                "scope": scope,
                "lim": Jsonb(limit.to_json()),
                "tokens": tokens,
                "holder": holder,
                "hold": hold_for,
                "req_burst": req.burst if req else None,
                "req_rate": req.rate if req else None,
                "tok_burst": tok.burst if tok else None,
                "tok_rate": tok.rate if tok else None,
                "max_concurrent": limit.max_concurrent,
                "flow": fair.flow,
                "weight": fair.weight,
                "cost": fair.cost,
                "window": fair.window,
                "grace": fair.grace,
                "linger": fair.linger,
                "tick": fair.tick,
                "forget": fair.forget,
            },
        )
        return Grant(bool(granted), float(wait), float(at), reason)

    async def renew(self, scope: str, holder: str, hold_for: float) -> bool:
        rows = await self._run(Q["renew"], {"scope": scope, "holder": holder, "hold": hold_for})
        return bool(rows)

    async def release(self, scope: str, holder: str) -> None:
        await self._run(Q["release"], {"scope": scope, "holder": holder})

    async def adjust(self, scope: str, limit: Limit, tokens: int) -> None:
        if tokens:
            _, tok = rates(limit)
            rate = tok.rate if tok else None
            await self._run(Q["adjust"], {"scope": scope, "tokens": tokens, "rate": rate})

    async def pause(self, scope: str, seconds: float, *, rate_limited: bool = True) -> None:
        check_scope(scope)
        params = {"scope": scope, "seconds": pause_seconds(seconds), "n": int(rate_limited)}
        await self._run(Q["pause"], params)

    async def note_wait(self, scope: str, seconds: float) -> None:
        check_scope(scope)
        await self._run(Q["note_wait"], {"scope": scope, "seconds": max(0.0, seconds)})

    async def stats(self, scopes: Sequence[str] | None = None) -> list[LimitStats]:
        # A read: safe to send again, so not checked on a connection fresh from a statement.
        if scopes is None:
            rows = await pgdb.sent_again_if_dropped(lambda: self._run(Q["stats"], {}))
        else:
            params = {"scopes": list(scopes)}
            rows = await pgdb.sent_again_if_dropped(lambda: self._run(Q["stats_of"], params))
        return [
            stats_of(
                r[0],
                r[1],
                r[10],
                req_tat=r[2],
                tok_tat=r[3],
                paused_until=r[4],
                requests=r[5],
                tokens=r[6],
                waits=r[7],
                wait_seconds=r[8],
                rate_limited=r[9],
                in_flight=r[11],
                flows=r[12],
                flows_at=r[13],
            )
            for r in rows
        ]

    async def _purge_all(self) -> int:
        return await in_batches(lambda limit: self.purge(batch=limit))

    async def purge(self, *, batch: int = 1000) -> int:
        """Delete up to ``batch`` scopes unused for ``ttl`` seconds; how many went."""
        if not self.ttl:
            return 0
        with self._errors():
            async with self._pool.connection() as conn:
                cur = await conn.execute(Q["purge"], {"ttl": self.ttl, "batch": batch})
                return cur.rowcount
