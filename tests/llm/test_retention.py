"""Retention of evaluation state and the ledger's summary (herd.llm.eval.ledger)."""

from __future__ import annotations

import asyncio
import random
from decimal import Decimal

import psycopg
import pytest

from herd.config import CACHE_TTL, EVAL_TTL, LEDGER_TTL, Settings
from herd.errors import ConfigError
from herd.llm.eval import EvalStore, ledger
from herd.llm.eval.money import as_float
from tests.llm.conftest import clean_eval_tables

# The read /overview made before the summary: every row, grouped, joined per key.
RECOMPUTED = """
WITH per_key AS (
    SELECT key, sum(cost) / nullif(count(DISTINCT coalesce(job_id, 0)), 0) AS cost
      FROM herd_eval_ledger WHERE kind = 'call' GROUP BY key
)
SELECT l.kind, count(*), sum(l.input_tokens), sum(l.output_tokens), sum(l.cost),
       sum(p.cost) FILTER (WHERE l.kind IN ('cache', 'singleflight', 'dedup')),
       sum(l.cached_input_tokens), sum(l.cache_write_tokens), sum(l.provider_saved),
       count(*) FILTER (WHERE l.cost IS NULL AND l.kind IN ('call', 'lost', 'failed',
                                                            'cut_short'))
  FROM herd_eval_ledger l LEFT JOIN per_key p ON p.key = l.key
 GROUP BY l.kind
"""


@pytest.mark.parametrize(
    ("name", "field", "default"),
    [
        ("HERD_LEDGER_TTL", "ledger_ttl", LEDGER_TTL),
        ("HERD_EVAL_TTL", "eval_ttl", EVAL_TTL),
        ("HERD_CACHE_TTL", "cache_ttl", CACHE_TTL),
    ],  # fmt: skip
)
def test_the_retention_settings(name, field, default):
    assert getattr(Settings.from_env({}), field) == default
    assert getattr(Settings.from_env({name: "60"}), field) == 60
    assert getattr(Settings.from_env({name: "0"}), field) == 0  # keep
    assert field in Settings.from_env({}).masked()  # `herd config` shows it
    for bad in ("-1", "1.5", "a month"):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: bad})


@pytest.fixture
async def store(pg_url):
    s = EvalStore(pg_url, purge_every=0)  # purged by the tests only, never in the background
    await s.open()
    clean_eval_tables(pg_url)
    yield s
    await s.close()


def approx(rows: dict) -> dict:
    return {
        k: {f: (pytest.approx(v) if isinstance(v, float) else v) for f, v in row.items()}
        for k, row in rows.items()
    }


async def recomputed(store: EvalStore) -> dict:
    return {
        kind: {
            "n": n,
            "input_tokens": int(i),
            "output_tokens": int(o),
            "cost": as_float(c),
            "saved": as_float(s),
            "cached_input_tokens": int(ci),
            "cache_write_tokens": int(cw),
            "provider_cache_saved": as_float(ps),
            "unpriced": int(u),
        }  # fmt: skip
        for kind, n, i, o, c, s, ci, cw, ps, u in await store.execute(RECOMPUTED)
    }


async def test_the_summary_equals_a_recomputation_and_outlives_the_purge(store):
    rnd = random.Random(14)
    rows = []
    for n in range(300):
        key = f"k{rnd.randrange(12)}"
        kind = rnd.choice(["call", "call", "lost", "cache", "singleflight", "dedup"])
        cost = None if key == "k0" else round(rnd.uniform(0.001, 0.1), 4)  # k0: unpriced
        paid = kind in ("call", "lost")
        rows.append({"batch": rnd.choice(["b1", "b2", None]), "job_id": rnd.randrange(20),
                     "key": key, "kind": kind, "input_tokens": n, "output_tokens": 2 * n,
                     "cost": cost if paid else None,
                     # the provider's prompt cache, on calls: summed apart from herd's
                     "cached_input_tokens": n // 2 if kind == "call" else 0,
                     "cache_write_tokens": n // 4 if kind == "call" else 0,
                     "provider_saved": (cost or 0) / 2 if kind == "call" and cost else None,
                     })  # fmt: skip
    # Concurrently, in random order: avoided rows land before and after the calls of
    # their key (a dedup row is written at submit, before its job calls).
    await asyncio.gather(*(store.record(**r) for r in rows))
    expected = await recomputed(store)
    assert set(expected) == {"call", "lost", "cache", "singleflight", "dedup"}
    assert expected["cache"]["saved"]  # the test covers a revalued estimate
    assert expected["call"]["unpriced"] and expected["lost"]["unpriced"]  # and k0's calls
    assert await store.totals() == approx(expected)
    b1 = await store.totals("b1")
    assert b1["call"]["n"] == sum(1 for r in rows if r["batch"] == "b1" and r["kind"] == "call")

    with psycopg.connect(store.url, autocommit=True) as conn:
        conn.execute(
            "UPDATE herd_eval_ledger SET at = now() - interval '100 days' WHERE id % 2 = 0"
        )
        conn.execute("UPDATE herd_eval_keys SET last_at = now() - interval '100 days'")
    removed = await store.purge(ledger_ttl=90 * 86400, eval_ttl=0)
    (left,) = await store.execute("SELECT count(*) FROM herd_eval_ledger")
    assert left[0] == 150 and removed >= 150
    assert await store.totals() == approx(expected)  # the totals stay after the rows go


async def test_old_rows_go_and_what_a_queued_item_needs_stays(store):
    await store.put_documents({"d-old": "old", "d-needed": "needed", "d-new": "new"})
    for h in ("s-old", "s-needed"):
        await store.execute(
            "INSERT INTO herd_eval_specs (hash, spec) VALUES (%s, '{}'::jsonb)", (h,)
        )
    await store.execute(
        "INSERT INTO herd_eval_items (batch, path, key, job_id, doc, spec, status, finished_at)"
        " VALUES ('b', 'done-old', 'k1', 1, 'd-old', 's-old', 'done', now() - interval '40 days'),"
        " ('b', 'done-new', 'k2', 2, 'd-new', 's-old', 'done', now()),"
        " ('b', 'queued', 'k3', 3, 'd-needed', 's-needed', 'queued', NULL)"
    )
    await store.record(batch="gone", job_id=9, key="k9", kind="call", cost=0.5)
    await store.record(batch="b", job_id=1, key="k1", kind="call", cost=0.25)
    with psycopg.connect(store.url, autocommit=True) as conn:
        for table in ("herd_eval_documents", "herd_eval_specs"):
            conn.execute(f"UPDATE {table} SET created_at = now() - interval '40 days'")
        conn.execute("UPDATE herd_eval_documents SET created_at = now() WHERE hash = 'd-new'")
        conn.execute(
            "UPDATE herd_eval_ledger SET at = now() - interval '100 days' WHERE batch = 'gone'"
        )
        conn.execute("UPDATE herd_eval_batch_totals SET updated_at = now() - interval '40 days'")
    await store.purge()  # the defaults: ledger 90 days, evaluations 30

    def col(rows):
        return sorted(r[0] for r in rows)

    assert col(await store.execute("SELECT path FROM herd_eval_items")) == ["done-new", "queued"]
    # d-old and s-old are no queued item's: they go; d-new was submitted just now.
    assert col(await store.execute("SELECT hash FROM herd_eval_documents")) == [
        "d-needed", "d-new"]  # fmt: skip
    assert col(await store.execute("SELECT hash FROM herd_eval_specs")) == ["s-needed"]
    assert col(await store.execute("SELECT key FROM herd_eval_ledger")) == ["k1"]
    # The batch with no items left loses its summary; b keeps its own.
    assert col(await store.execute("SELECT DISTINCT batch FROM herd_eval_batch_totals")) == ["b"]
    assert (await store.totals())["call"]["n"] == 2  # all-time totals stay
    assert await store.document("d-needed") == "needed"


async def test_a_document_is_kept_while_a_legacy_item_is_queued(store):
    await store.put_documents({"d-old": "old"})
    await store.execute(
        "INSERT INTO herd_eval_items (batch, path, key, job_id) VALUES ('b', 'p', 'k', 1)"
    )  # stored before 3001: it does not say which document it needs
    await store.execute("UPDATE herd_eval_documents SET created_at = now() - interval '40 days'")
    await store.purge()
    assert await store.document("d-old") == "old"


async def test_zero_keeps_everything(store):
    await store.record(batch="b", job_id=1, key="k", kind="call", cost=0.1)
    await store.execute("UPDATE herd_eval_ledger SET at = now() - interval '10 years'")
    assert await store.purge(ledger_ttl=0, eval_ttl=0) == 0
    assert len(await store.execute("SELECT 1 FROM herd_eval_ledger")) == 1


async def test_a_call_is_closed_and_an_avoided_one_recorded_in_one_statement_each(store):
    """The ledger's row, its key's estimate, its batch's and the kinds' totals and the
    batch's spend are written by one statement (they were eleven for a paid call: a
    third of an evaluated piece's statements), and count what they counted."""
    await store.execute("INSERT INTO herd_eval_batches (batch, budget) VALUES ('b', 1)")
    sent: list[str] = []
    async with await psycopg.AsyncConnection.connect(store.url, autocommit=True) as conn:
        real = conn.execute

        async def counting(query, params=None, **kw):
            sent.append(query)
            return await real(query, params, **kw)

        conn.execute = counting  # type: ignore[method-assign]
        assert await ledger.reserve(conn, "b", Decimal("0.5"))
        opened = {"batch": "b", "job": 7, "key": "k", "model": "m", "provider": "p", "i": 100,
                  "w": Decimal("0.5")}  # fmt: skip
        call = await ledger.open_call(conn, opened)
        sent.clear()
        assert await ledger.close(conn, call, "call", i=90, o=10, cost=Decimal("0.25"))
        await ledger.record(conn, {"batch": "b", "job": 8, "key": "k", "kind": "cache",
                                   "model": "m", "provider": "p", "i": 0, "o": 0,
                                   "cost": None})  # fmt: skip
        assert len(sent) == 2
        assert not await ledger.close(conn, call, "call", i=90, o=10, cost=Decimal("0.25"))
    totals = await store.totals("b")
    assert (totals["call"]["n"], totals["call"]["input_tokens"], totals["call"]["cost"]) == (
        1, 90, 0.25)  # fmt: skip
    assert totals["cache"]["n"] == 1
    assert (await store.totals())["cache"]["saved"] == 0.25  # the key's one call
    ((spent, reserved),) = await store.execute(
        "SELECT spent, reserved FROM herd_eval_batches WHERE batch = 'b'"
    )
    assert (spent, reserved) == (Decimal("0.25"), 0)
