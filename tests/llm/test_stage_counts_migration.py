"""Migration 3021 on a store that already holds pipelines: its counters and stage totals
start from what is there (pieces of every status, paid calls found by key and by job),
then triggers keep them. Its own database: the migrations before it, rows, then it."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from herd.db.postgres import migrations
from tests.conftest import TEST_DB
from tests.helpers import fresh_database
from tests.llm.test_pipeline import BY_ROWS, COSTS_BY_ROWS

FRESH = f"{TEST_DB}_3021"


@pytest.fixture
def before_3021(pg_url: str) -> Iterator[str]:
    with fresh_database(pg_url, FRESH) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            for version, _, text in migrations("herd.llm.sql"):
                if version < 3021:
                    conn.execute(text.encode())
        yield url


PIECES = [  # path, stage, round, seq, key, status, source, job
    ("a.md", "notes", 1, 0, "k1", "done", "computed", 11),
    ("a.md", "notes", 1, 1, "k2", "done", "hit", 12),
    ("a.md", "notes", 1, 2, "k3", "failed", None, 13),
    ("b.md", "notes", 1, 0, "k1", "done", "waited", 14),
    ("b.md", "notes", 1, 1, "k4", "queued", None, 15),
    ("a.md", "summary", 1, 0, "s1", "done", "computed", 21),
    ("a.md", "summary", 2, 0, "s2", "done", "computed", 22),
    ("b.md", "summary", 1, 0, "s3", "cancelled", None, None),
]
LEDGER = [  # key, job, kind, state, input, output, cost
    ("k1", 11, "call", "closed", 100, 10, "0.0012"),
    ("k3", 13, "failed", "closed", 90, 0, "0.0009"),
    ("fallback-key", 12, "call", "closed", 80, 8, None),  # a fallback: found by its job
    ("s1", 21, "call", "closed", 300, 30, "0.0040"),
    ("s2", 22, "call", "open", 300, 0, None),  # still open: not counted yet
    ("k2", 12, "cache", "closed", 0, 0, None),  # avoided: not a paid call
]


def test_3021_counts_what_was_there_and_keeps_counting(before_3021):
    with psycopg.connect(before_3021) as conn:
        for path, stage, round_, seq, key, status, source, job in PIECES:
            conn.execute(
                "INSERT INTO herd_eval_pieces (batch, path, stage, round, seq, key, spec, doc,"
                " status, source, job_id) VALUES ('b', %s, %s, %s, %s, %s, 's', 'd', %s, %s, %s)",
                (path, stage, round_, seq, key, status, source, job),
            )
        for key, job, kind, state, i, o, cost in LEDGER:
            conn.execute(
                "INSERT INTO herd_eval_ledger (batch, job_id, key, kind, state, input_tokens,"
                " output_tokens, cost) VALUES ('b', %s, %s, %s, %s, %s, %s, %s)",
                (job, key, kind, state, i, o, cost),
            )
        conn.commit()
        ((text,),) = [(t,) for v, _, t in migrations("herd.llm.sql") if v == 3021]
        conn.execute(text.encode())
        conn.commit()

        def counted() -> tuple[dict, dict]:
            pieces = {
                s: (int(n), int(d), int(f), int(c), int(h), int(r))
                for s, n, d, f, c, h, r in conn.execute(
                    "SELECT stage, sum(n), coalesce(sum(n) FILTER (WHERE status = 'done'),"
                    " 0), coalesce(sum(n) FILTER (WHERE status = 'failed'), 0),"
                    " coalesce(sum(n) FILTER (WHERE status = 'cancelled'), 0),"
                    " coalesce(sum(n) FILTER (WHERE cached), 0), max(round)"
                    " FROM herd_eval_piece_counts WHERE batch = 'b' GROUP BY stage"
                )
            }
            costs = {
                s: (int(n), int(i), int(o), c)
                for s, n, i, o, c in conn.execute(
                    "SELECT stage, sum(n), sum(input_tokens), sum(output_tokens), sum(cost)"
                    " FROM herd_eval_stage_costs WHERE batch = 'b' GROUP BY stage"
                )
            }
            return pieces, costs  # fmt: skip

        def by_rows() -> tuple[dict, dict]:
            pieces = {s: tuple(int(x) for x in r) for s, *r in conn.execute(BY_ROWS, {"b": "b"})}
            costs = {s: (int(n), int(i), int(o), c) for s, n, i, o, c in
                     conn.execute(COSTS_BY_ROWS, {"b": "b"})}  # fmt: skip
            return pieces, costs

        pieces, costs = counted()
        assert (pieces, costs) == by_rows()
        assert pieces["notes"] == (5, 3, 1, 0, 2, 1) and pieces["summary"] == (3, 2, 0, 1, 0, 2)
        # k1 once (two pieces ask it), k3 failed, the fallback by its job; s1; not s2 (open).
        assert costs["notes"][:3] == (3, 270, 18) and costs["summary"][:3] == (1, 300, 30)
        # From here the triggers count: the open call closes, a waiting piece ends.
        conn.execute("UPDATE herd_eval_ledger SET state = 'closed', output_tokens = 5,"
                     " cost = 0.003 WHERE key = 's2'")  # fmt: skip
        conn.execute("UPDATE herd_eval_pieces SET status = 'done', source = 'stale'"
                     " WHERE key = 'k4'")  # fmt: skip
        conn.commit()
        assert counted() == by_rows()
        assert counted()[1]["summary"][:3] == (2, 600, 35)
