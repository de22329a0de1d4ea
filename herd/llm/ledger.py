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

from typing import Any

from psycopg import AsyncConnection, sql

AVOIDED = ("cache", "singleflight", "dedup")
PAID = ("call", "lost", "failed", "cut_short")  # calls that reached the provider
KINDS = (*PAID, *AVOIDED)

_KEY = """
INSERT INTO herd_eval_keys (key) VALUES (%(key)s)
ON CONFLICT (key) DO UPDATE SET last_at = now()
RETURNING cost, jobs, cache, singleflight, dedup
"""

_NEW_JOB = """
SELECT NOT EXISTS (SELECT 1 FROM herd_eval_ledger
                    WHERE key = %(key)s AND kind = 'call' AND state = 'closed'
                      AND coalesce(job_id, 0) = coalesce(%(job)s::bigint, 0))
"""

_INSERT = """
INSERT INTO herd_eval_ledger (batch, job_id, key, kind, model, provider, input_tokens,
                              output_tokens, cost, cached_input_tokens, cache_write_tokens,
                              provider_saved)
VALUES (%(batch)s, %(job)s, %(key)s, %(kind)s, %(model)s, %(provider)s, %(i)s, %(o)s, %(cost)s,
        %(ci)s, %(cw)s, %(ps)s)
"""

# NULL + x is x and NULL + NULL stays NULL: sum()'s semantics, one row at a time.
_ADD = "CASE WHEN excluded.{c} IS NULL THEN t.{c} ELSE coalesce(t.{c}, 0) + excluded.{c} END"

# Kinds in a fixed order: every transaction locks its key's row, then its batch's,
# then totals in KINDS order, so concurrent inserts queue and never deadlock.
_CACHED = """cached_input_tokens = t.cached_input_tokens + excluded.cached_input_tokens,
       cache_write_tokens = t.cache_write_tokens + excluded.cache_write_tokens"""

_TOTALS = f"""
INSERT INTO herd_eval_ledger_totals AS t (kind, n, input_tokens, output_tokens, cost, saved,
                                          cached_input_tokens, cache_write_tokens,
                                          provider_saved)
SELECT * FROM unnest(%(kinds)s::text[], %(n)s::bigint[], %(i)s::bigint[], %(o)s::bigint[],
                     %(cost)s::float8[], %(saved)s::float8[], %(ci)s::bigint[],
                     %(cw)s::bigint[], %(ps)s::float8[])
ON CONFLICT (kind) DO UPDATE
   SET n = t.n + excluded.n, input_tokens = t.input_tokens + excluded.input_tokens,
       output_tokens = t.output_tokens + excluded.output_tokens,
       cost = {_ADD.format(c="cost")}, saved = {_ADD.format(c="saved")},
       {_CACHED}, provider_saved = {_ADD.format(c="provider_saved")}
"""

_BATCH = f"""
INSERT INTO herd_eval_batch_totals AS t (batch, kind, n, input_tokens, output_tokens, cost,
                                         cached_input_tokens, cache_write_tokens,
                                         provider_saved)
VALUES (%(batch)s, %(kind)s, 1, %(i)s, %(o)s, %(cost)s, %(ci)s, %(cw)s, %(ps)s)
ON CONFLICT (batch, kind) DO UPDATE
   SET n = t.n + 1, input_tokens = t.input_tokens + excluded.input_tokens,
       output_tokens = t.output_tokens + excluded.output_tokens,
       cost = {_ADD.format(c="cost")}, {_CACHED},
       provider_saved = {_ADD.format(c="provider_saved")}, updated_at = now()
"""

CACHE_FIELDS = {"ci": 0, "cw": 0, "ps": None}  # a row's prompt-cache figures when it has none


def _estimate(cost: float | None, jobs: int) -> float | None:
    return cost / jobs if cost is not None and jobs else None


async def record(conn: AsyncConnection[Any], row: dict[str, Any]) -> None:
    """Insert one closed ledger row (keys of _INSERT; the prompt-cache ones may be left
    out) and bring the summary up to date, in one transaction on ``conn``."""
    row = {**CACHE_FIELDS, **row}
    async with conn.transaction():
        await _summarize(conn, row)
        await conn.execute(_INSERT, row)


async def _summarize(conn: AsyncConnection[Any], row: dict[str, Any]) -> None:
    """Count a row that is being closed (or written closed) in the summaries; in the
    caller's transaction, before the row itself reads as closed."""
    kind, cost = row["kind"], row["cost"]
    totals: dict[str, list[Any]] = {
        kind: [1, row["i"], row["o"], cost, None, row["ci"], row["cw"], row["ps"]]
    }
    if kind in ("call", *AVOIDED):
        cur = await conn.execute(_KEY, row)  # locks the key's row until commit
        fetched = await cur.fetchone()
        assert fetched is not None
        key_cost, jobs, *avoided = fetched
        before = _estimate(key_cost, jobs)
        if kind == "call":
            cur = await conn.execute(_NEW_JOB, row)
            new_job = (await cur.fetchone() or (False,))[0]
            if cost is not None:
                key_cost = cost if key_cost is None else key_cost + cost
            jobs += 1 if new_job else 0
            after = _estimate(key_cost, jobs)
            if after is not None:
                for other, n in zip(AVOIDED, avoided, strict=True):
                    if n and after != before:
                        revalued = n * (after - (before or 0.0))
                        totals[other] = [0, 0, 0, None, revalued, 0, 0, None]
            await conn.execute(
                "UPDATE herd_eval_keys SET cost = %s, jobs = %s WHERE key = %s",
                (key_cost, jobs, row["key"]),
            )
        else:
            totals[kind][4] = before
            column = sql.Identifier(kind)  # one of AVOIDED, a column of herd_eval_keys
            await conn.execute(
                sql.SQL("UPDATE herd_eval_keys SET {0} = {0} + 1 WHERE key = %s").format(column),
                (row["key"],),
            )
    if row["batch"] is not None:
        await conn.execute(_BATCH, row)
    kinds = [k for k in KINDS if k in totals]
    columns = [list(c) for c in zip(*(totals[k] for k in kinds), strict=True)]
    await conn.execute(
        _TOTALS,
        {
            "kinds": kinds,
            **dict(zip(("n", "i", "o", "cost", "saved", "ci", "cw", "ps"), columns, strict=True)),
        },
    )


# The reservation and the check against the budget in one statement: two workers
# reserving at once are serialized on the batch's row, so neither sees room the
# other has taken. No row back: over budget, parked, or a batch without a row.
RESERVE = """
UPDATE herd_eval_batches SET reserved = reserved + %(w)s, updated_at = now()
 WHERE batch = %(b)s AND parked IS NULL
   AND (budget IS NULL OR spent + reserved + %(w)s <= budget)
RETURNING budget
"""

BATCH = """
SELECT budget, spent, reserved, parked, limits FROM herd_eval_batches WHERE batch = %(b)s
"""

_OPEN = """
INSERT INTO herd_eval_ledger (batch, job_id, key, kind, model, provider, input_tokens, state,
                              reserved)
VALUES (%(batch)s, %(job)s, %(key)s, 'call', %(model)s, %(provider)s, %(i)s, 'open', %(w)s)
RETURNING id
"""

_LOCK_OPEN = """
SELECT batch, job_id, key, model, provider, input_tokens, reserved FROM herd_eval_ledger
 WHERE id = %(id)s AND state = 'open' FOR UPDATE
"""

_CLOSE = """
UPDATE herd_eval_ledger SET state = 'closed', kind = %(kind)s, input_tokens = %(i)s,
       output_tokens = %(o)s, cost = %(cost)s, cached_input_tokens = %(ci)s,
       cache_write_tokens = %(cw)s, provider_saved = %(ps)s
 WHERE id = %(id)s
"""

_NOT_SENT = "DELETE FROM herd_eval_ledger WHERE id = %(id)s"

_SPEND = """
UPDATE herd_eval_batches
   SET spent = spent + coalesce(%(cost)s, 0),
       reserved = greatest(0, reserved - coalesce(%(w)s, 0)), updated_at = now()
 WHERE batch = %(batch)s
"""

# Every open call of a job (at its next run), or older than the ledger TTL (purge).
_OPEN_OF_JOB = """
SELECT id FROM herd_eval_ledger WHERE job_id = %(job)s AND state = 'open' ORDER BY id
"""
_OPEN_BEFORE = """
SELECT id FROM herd_eval_ledger
 WHERE state = 'open' AND at < now() - make_interval(secs => %(keep)s)
 ORDER BY at LIMIT %(limit)s
"""


async def open_call(conn: AsyncConnection[Any], row: dict[str, Any]) -> int:
    """Open a call's row (keys of _OPEN: ``w`` the reservation) before the request
    leaves; in the caller's transaction (fenced by the job's lease on PostgreSQL)."""
    cur = await conn.execute(_OPEN, row)
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
    cost: float | None = None,
    cached: int = 0,
    written: int = 0,
    provider_saved: float | None = None,
) -> bool:
    """Close an open call as ``kind`` with its usage and cost (``i`` None: the
    estimate it was opened with; ``cached``/``written``: its input tokens read from and
    written to the provider's prompt cache, ``provider_saved`` what that saved), count
    it in the summaries and release its reservation into the batch's spent, in one
    transaction. ``kind`` None: the
    request never left, the row goes and nothing is counted. False when the row was
    closed already (another worker took it over as cut short)."""
    async with conn.transaction():
        cur = await conn.execute(_LOCK_OPEN, {"id": call_id})
        found = await cur.fetchone()
        if found is None:
            return False
        batch, job, key, model, provider, estimate, reserved = found
        if kind is None:
            await conn.execute(_NOT_SENT, {"id": call_id})
            await conn.execute(_SPEND, {"batch": batch, "cost": None, "w": reserved})
            return True
        if kind == "cut_short":
            cost = reserved  # the worst case it reserved: what it may have cost
        row = {"id": call_id, "batch": batch, "job": job, "key": key, "kind": kind,
               "model": model, "provider": provider, "i": estimate if i is None else i,
               "o": o, "cost": cost, "ci": cached, "cw": written,
               "ps": provider_saved}  # fmt: skip
        await _summarize(conn, row)
        await conn.execute(_CLOSE, row)
        if batch is not None:
            await conn.execute(_SPEND, {"batch": batch, "cost": cost, "w": reserved})
        return True


async def cut_short(conn: AsyncConnection[Any], *, job_id: int | None = None,
                    keep: float = 0.0, limit: int = 1000) -> int:  # fmt: skip
    """Close as 'cut_short' the open calls of ``job_id`` (its previous run died
    mid-call), or with None those opened more than ``keep`` seconds ago; returns how
    many."""
    if job_id is not None:
        cur = await conn.execute(_OPEN_OF_JOB, {"job": job_id})
    else:
        cur = await conn.execute(_OPEN_BEFORE, {"keep": keep, "limit": limit})
    closed = 0
    for (call_id,) in await cur.fetchall():
        closed += await close(conn, call_id, "cut_short")
    return closed


TOTALS = """
SELECT kind, n, input_tokens, output_tokens, cost, saved, cached_input_tokens,
       cache_write_tokens, provider_saved FROM herd_eval_ledger_totals
"""

BATCH_TOTALS = """
SELECT kind, n, input_tokens, output_tokens, cost, NULL::float8, cached_input_tokens,
       cache_write_tokens, provider_saved FROM herd_eval_batch_totals
 WHERE batch = %(b)s
"""

# Retention, one bounded batch per statement, oldest first along an index; SKIP LOCKED
# lets several processes purge side by side. %(keep)s: seconds, %(limit)s: rows.
PURGE_LEDGER = """
DELETE FROM herd_eval_ledger WHERE id IN (
    SELECT id FROM herd_eval_ledger WHERE at < now() - make_interval(secs => %(keep)s)
       AND state = 'closed'
     ORDER BY at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""

# A key's last_at moves with each of its rows: past the cutoff, its rows are too.
PURGE_KEYS = """
DELETE FROM herd_eval_keys WHERE key IN (
    SELECT key FROM herd_eval_keys WHERE last_at < now() - make_interval(secs => %(keep)s)
     ORDER BY last_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""

# Finished items only: a queued or parked one (its job pending, running or
# dead-lettered) stays.
PURGE_ITEMS = """
DELETE FROM herd_eval_items WHERE (batch, path) IN (
    SELECT batch, path FROM herd_eval_items
     WHERE status IN ('done', 'cancelled')
       AND finished_at < now() - make_interval(secs => %(keep)s)
     ORDER BY finished_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""

PURGE_BATCH_TOTALS = """
DELETE FROM herd_eval_batch_totals WHERE (batch, kind) IN (
    SELECT batch, kind FROM herd_eval_batch_totals b
     WHERE updated_at < now() - make_interval(secs => %(keep)s)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_items i WHERE i.batch = b.batch)
     ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""

# A queued item of a row stored before migration 3001 does not say what it needs.
LEGACY_QUEUED = """
SELECT EXISTS (SELECT 1 FROM herd_eval_items
                WHERE status IN ('queued', 'parked') AND (doc IS NULL OR spec IS NULL))
"""

# created_at is refreshed by each submission, so a document being submitted now is
# never past the cutoff between its upsert and its item's insert.
PURGE_DOCUMENTS = """
DELETE FROM herd_eval_documents WHERE hash IN (
    SELECT hash FROM herd_eval_documents d
     WHERE created_at < now() - make_interval(secs => %(keep)s)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_items i
                        WHERE i.status IN ('queued', 'parked') AND i.doc = d.hash)
     ORDER BY created_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""

PURGE_SPECS = """
DELETE FROM herd_eval_specs WHERE hash IN (
    SELECT hash FROM herd_eval_specs s
     WHERE created_at < now() - make_interval(secs => %(keep)s)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_items i
                        WHERE i.status IN ('queued', 'parked') AND i.spec = s.hash)
     ORDER BY created_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""

# A batch's row goes with its last item, as its totals do: never while one waits.
# A provider batch's row once its answers are fanned out (herd.llm.batchapi); one still
# submitting or polling stays: its handle is what keeps it from being made twice.
PURGE_PROVIDER_BATCHES = """
DELETE FROM herd_eval_provider_batches WHERE handle IN (
    SELECT handle FROM herd_eval_provider_batches
     WHERE state = 'done' AND updated_at < now() - make_interval(secs => %(keep)s)
     ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""

PURGE_BATCHES = """
DELETE FROM herd_eval_batches WHERE batch IN (
    SELECT batch FROM herd_eval_batches b
     WHERE updated_at < now() - make_interval(secs => %(keep)s)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_items i WHERE i.batch = b.batch)
     ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""
