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
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, sql

AVOIDED = ("cache", "singleflight", "dedup")
KINDS = ("call", "lost", *AVOIDED)

_KEY = """
INSERT INTO herd_eval_keys (key) VALUES (%(key)s)
ON CONFLICT (key) DO UPDATE SET last_at = now()
RETURNING cost, jobs, cache, singleflight, dedup
"""

_NEW_JOB = """
SELECT NOT EXISTS (SELECT 1 FROM herd_eval_ledger
                    WHERE key = %(key)s AND kind = 'call'
                      AND coalesce(job_id, 0) = coalesce(%(job)s::bigint, 0))
"""

_INSERT = """
INSERT INTO herd_eval_ledger (batch, job_id, key, kind, model, provider, input_tokens,
                              output_tokens, cost)
VALUES (%(batch)s, %(job)s, %(key)s, %(kind)s, %(model)s, %(provider)s, %(i)s, %(o)s, %(cost)s)
"""

# NULL + x is x and NULL + NULL stays NULL: sum()'s semantics, one row at a time.
_ADD = "CASE WHEN excluded.{c} IS NULL THEN t.{c} ELSE coalesce(t.{c}, 0) + excluded.{c} END"

# Kinds in a fixed order: every transaction locks its key's row, then its batch's,
# then totals in KINDS order, so concurrent inserts queue and never deadlock.
_TOTALS = f"""
INSERT INTO herd_eval_ledger_totals AS t (kind, n, input_tokens, output_tokens, cost, saved)
SELECT * FROM unnest(%(kinds)s::text[], %(n)s::bigint[], %(i)s::bigint[], %(o)s::bigint[],
                     %(cost)s::float8[], %(saved)s::float8[])
ON CONFLICT (kind) DO UPDATE
   SET n = t.n + excluded.n, input_tokens = t.input_tokens + excluded.input_tokens,
       output_tokens = t.output_tokens + excluded.output_tokens,
       cost = {_ADD.format(c="cost")}, saved = {_ADD.format(c="saved")}
"""

_BATCH = f"""
INSERT INTO herd_eval_batch_totals AS t (batch, kind, n, input_tokens, output_tokens, cost)
VALUES (%(batch)s, %(kind)s, 1, %(i)s, %(o)s, %(cost)s)
ON CONFLICT (batch, kind) DO UPDATE
   SET n = t.n + 1, input_tokens = t.input_tokens + excluded.input_tokens,
       output_tokens = t.output_tokens + excluded.output_tokens,
       cost = {_ADD.format(c="cost")}, updated_at = now()
"""


def _estimate(cost: float | None, jobs: int) -> float | None:
    return cost / jobs if cost is not None and jobs else None


async def record(conn: AsyncConnection[Any], row: dict[str, Any]) -> None:
    """Insert one ledger row (keys of _INSERT) and bring the summary up to date, in
    one transaction on ``conn``."""
    kind, cost = row["kind"], row["cost"]
    totals: dict[str, list[Any]] = {kind: [1, row["i"], row["o"], cost, None]}
    async with conn.transaction():
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
                            totals[other] = [0, 0, 0, None, n * (after - (before or 0.0))]
                await conn.execute(
                    "UPDATE herd_eval_keys SET cost = %s, jobs = %s WHERE key = %s",
                    (key_cost, jobs, row["key"]),
                )
            else:
                totals[kind][4] = before
                column = sql.Identifier(kind)  # one of AVOIDED, a column of herd_eval_keys
                await conn.execute(
                    sql.SQL("UPDATE herd_eval_keys SET {0} = {0} + 1 WHERE key = %s").format(
                        column
                    ),
                    (row["key"],),
                )
        await conn.execute(_INSERT, row)
        if row["batch"] is not None:
            await conn.execute(_BATCH, row)
        kinds = [k for k in KINDS if k in totals]
        columns = [list(c) for c in zip(*(totals[k] for k in kinds), strict=True)]
        await conn.execute(
            _TOTALS,
            {"kinds": kinds, **dict(zip(("n", "i", "o", "cost", "saved"), columns, strict=True))},
        )


TOTALS = """
SELECT kind, n, input_tokens, output_tokens, cost, saved FROM herd_eval_ledger_totals
"""

BATCH_TOTALS = """
SELECT kind, n, input_tokens, output_tokens, cost FROM herd_eval_batch_totals
 WHERE batch = %(b)s
"""

# Retention, one bounded batch per statement, oldest first along an index; SKIP LOCKED
# lets several processes purge side by side. %(keep)s: seconds, %(limit)s: rows.
PURGE_LEDGER = """
DELETE FROM herd_eval_ledger WHERE id IN (
    SELECT id FROM herd_eval_ledger WHERE at < now() - make_interval(secs => %(keep)s)
     ORDER BY at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""

# A key's last_at moves with each of its rows: past the cutoff, its rows are too.
PURGE_KEYS = """
DELETE FROM herd_eval_keys WHERE key IN (
    SELECT key FROM herd_eval_keys WHERE last_at < now() - make_interval(secs => %(keep)s)
     ORDER BY last_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""

# Finished items only: a queued one (its job pending, running or dead-lettered) stays.
PURGE_ITEMS = """
DELETE FROM herd_eval_items WHERE (batch, path) IN (
    SELECT batch, path FROM herd_eval_items
     WHERE status = 'done' AND finished_at < now() - make_interval(secs => %(keep)s)
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
                WHERE status = 'queued' AND (doc IS NULL OR spec IS NULL))
"""

# created_at is refreshed by each submission, so a document being submitted now is
# never past the cutoff between its upsert and its item's insert.
PURGE_DOCUMENTS = """
DELETE FROM herd_eval_documents WHERE hash IN (
    SELECT hash FROM herd_eval_documents d
     WHERE created_at < now() - make_interval(secs => %(keep)s)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_items i
                        WHERE i.status = 'queued' AND i.doc = d.hash)
     ORDER BY created_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""

PURGE_SPECS = """
DELETE FROM herd_eval_specs WHERE hash IN (
    SELECT hash FROM herd_eval_specs s
     WHERE created_at < now() - make_interval(secs => %(keep)s)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_items i
                        WHERE i.status = 'queued' AND i.spec = s.hash)
     ORDER BY created_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
"""
