"""The cost ledger's summary, kept in the transaction of each ledger row.

Read paths (/overview, /metrics, `herd status`, `herd eval status`) read the
summary tables of migration 3001: a row per kind, and per batch and kind, never
the ledger itself, so they cost the same with a million rows as with ten, and the
totals survive the purge of the itemised rows (HERD_LEDGER_TTL).

Money saved: an avoided call (cache, singleflight, dedup) is worth what one
computation of its key cost: the cost of the key's calls divided by the number of
jobs that made them (a repair is a second call of one job). herd_eval_keys keeps
those two figures and how many calls of each avoided kind the key has saved, so a
later call that changes the key's estimate revalues the saved totals by
``avoided × (new estimate − old)`` in the same transaction. That is exactly what a
recomputation over the ledger gives, also for a dedup row written before the call
it avoided, until the key's rows are purged; after that the estimate of a key that
comes back starts over.

The provider's prompt cache is counted apart (migration 3003): a call's cached input
and cache-write tokens, and ``provider_saved``, its cost at the full input price minus
its cost (herd.llm.pricing.Price.cache_saved). ``saved`` stays herd's own cache.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from psycopg import AsyncConnection

from herd.db.queries import named
from herd.llm.eval.money import money

# Calls that reached the provider (herd_ledger_count, migration 3022, names them too).
PAID = ("call", "lost", "failed", "cut_short")

Q = named("herd.llm.eval")
CACHE_FIELDS = {"ci": 0, "cw": 0, "ps": None}  # a row's prompt-cache figures when it has none


def _exact(row: dict[str, Any]) -> dict[str, Any]:
    return {**CACHE_FIELDS, "kid": None, **row, "cost": money(row.get("cost")),
            "ps": money(row.get("ps"))}  # fmt: skip


async def record(conn: AsyncConnection[Any], row: dict[str, Any]) -> None:
    """Insert one closed ledger row (keys of ledger_record; the prompt-cache ones and
    ``kid``, the id of the key that paid, may be left out) and bring the summary up to
    date, in one statement on ``conn`` (the key's row, the batch's, then the totals in
    kind order, herd_ledger_count: concurrent writers queue and never deadlock)."""
    await conn.execute(Q["ledger_record"], _exact(row))


async def reserve(conn: AsyncConnection[Any], batch: str, worst: Decimal | None) -> bool | None:
    """Reserve a call's worst case against its batch's budget, checked in the same
    statement: two workers reserving at once are serialized on the batch's row, so
    neither sees room the other has taken. None: over budget, parked, or a batch
    without a row; else whether the batch has a budget."""
    cur = await conn.execute(Q["ledger_reserve"], {"b": batch, "w": worst or Decimal(0)})
    found = await cur.fetchone()
    return None if found is None else found[0] is not None


async def open_call(conn: AsyncConnection[Any], row: dict[str, Any]) -> int:
    """Open a call's row (keys of ledger_open: ``w`` the reservation, ``kid`` the id of
    the key that pays, never the key) before the request leaves; in the caller's
    transaction (fenced by the job's lease on PostgreSQL)."""
    cur = await conn.execute(Q["ledger_open"], {"kid": None, **row, "w": money(row.get("w"))})
    fetched = await cur.fetchone()
    assert fetched is not None
    return int(fetched[0])


async def close(
    conn: AsyncConnection[Any],
    call_id: int,
    kind: str | None,
    *,
    i: int | None = None,
    o: int = 0,
    cost: Decimal | float | None = None,
    cached: int = 0,
    written: int = 0,
    provider_saved: Decimal | float | None = None,
) -> bool:
    """Close an open call as ``kind`` with its usage and cost (``i`` None: the
    estimate it was opened with; ``cached``/``written``: its input tokens read from and
    written to the provider's prompt cache, ``provider_saved`` what that saved), count
    it in the summaries and release its reservation into the batch's spent, in one
    statement (herd_ledger_close). ``kind`` None: the request never left, the row goes
    and nothing is counted. False when the row was closed already (another worker took
    it over as cut short).

    A call that may have been billed without its usage coming back (cut short, lost,
    failed after sending) is charged its reservation: the provider bills the output it
    generated after the client left, and a budget must hold for it."""
    row = _exact({"id": call_id, "kind": kind, "i": i, "o": o, "cost": cost, "ci": cached,
                  "cw": written, "ps": provider_saved})  # fmt: skip
    cur = await conn.execute(Q["ledger_close"], row)
    found = await cur.fetchone()
    return bool(found and found[0])


# Calls whose usage never came back: charged at their reservation (the worst case).
ESTIMATED = ("cut_short", "lost", "failed")


async def cut_short(conn: AsyncConnection[Any], *, job_id: int | None = None,
                    keep: float = 0.0, limit: int = 1000) -> int:  # fmt: skip
    """Close as 'cut_short' the open calls of ``job_id`` (its previous run died
    mid-call), or with None those opened more than ``keep`` seconds ago; returns how
    many."""
    if job_id is not None:
        cur = await conn.execute(Q["ledger_open_of_job"], {"job": job_id})
    else:
        cur = await conn.execute(Q["ledger_open_before"], {"keep": keep, "limit": limit})
    closed = 0
    for (call_id,) in await cur.fetchall():
        closed += await close(conn, call_id, "cut_short")
    return closed
