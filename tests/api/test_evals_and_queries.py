"""Evaluations submitted over HTTP; retrieval over a corpus indexed for real."""

from __future__ import annotations

import uuid

import psycopg

from herd.builtin import tasks as builtin_tasks
from herd.rag.ingest import plan_and_apply
from tests.rag.test_ingest import drain

SPEC = {
    "model": "sim-small",
    "system": "Summarize the document as JSON.",
    "schema": {"type": "object"},
}


async def test_submit_documents_dedups_identical_ones_and_reports_status(client, pg_app):
    docs = [
        {"name": "a.txt", "text": "The lease expired."},
        {"name": "b.txt", "text": "The lease expired."},  # the same evaluation: one job
        {"name": "c.txt", "text": "'); DROP TABLE herd_eval_items; -- ✓"},
    ]
    r = await client.post("/evals", json={**SPEC, "documents": docs, "batch": "api-1"})
    assert r.status_code == 201, r.text
    out = r.json()
    assert out["batch"] == "api-1" and out["queued"] == 2 and out["deduplicated"] == 1
    assert out["job_ids"][0] == out["job_ids"][1] != out["job_ids"][2]
    job = (await client.get(f"/jobs/{out['job_ids'][2]}")).json()
    assert job["task"] == "herd.eval" and job["queue"] == "eval"
    status = (await client.get("/evals/api-1")).json()
    assert status["documents"] == 3 and status["done"] == 0 and status["failed"] == 0
    assert status["ledger"]["dedup"]["n"] == 1
    again = (await client.post("/evals", json={**SPEC, "documents": docs[:1]})).json()
    assert again["deduplicated"] == 1 and again["batch"].startswith("eval-")


async def test_eval_validation_names_the_field(client):
    r = await client.post("/evals", json={**SPEC, "documents": [], "provider": "acme"})
    assert r.status_code == 422
    assert {e["field"] for e in r.json()["errors"]} == {"documents", "provider"}


async def test_query_a_collection_that_has_no_index_is_404(client):
    r = await client.post("/query", json={"texts": ["light"], "collection": "nowhere"})
    assert r.status_code == 404 and "herd ingest" in r.json()["error"]
    assert (await client.post("/query", json={"texts": []})).status_code == 422


async def test_query_returns_the_nearest_chunks_with_references(
    client, pg_app, tmp_path, herd_home, pg_url
):
    name = f"c{uuid.uuid4().hex[:10]}"
    corpus = tmp_path / "notes.md"
    corpus.write_text(
        "# Leases\n\nA lease that is not renewed expires; another worker takes the job over.\n\n"
        "# Caches\n\nThe exact cache stores each model answer once, keyed by its inputs.\n"
    )
    pg_app.settings = pg_app.settings.override(home=herd_home)  # the model cache lives there
    pg_app.include(builtin_tasks)
    await plan_and_apply(pg_app, [corpus], name)
    await drain(pg_app)
    r = await client.post(
        "/query",
        json={
            "texts": ["what happens when a worker dies?", "cached answers"],
            "collection": name,
            "k": 1,
        },
    )
    assert r.status_code == 200, r.text
    first, second = r.json()["answers"]
    assert first["query"] == "what happens when a worker dies?"
    assert "lease" in first["hits"][0]["text"] and "cache" in second["hits"][0]["text"]
    assert 0 < first["hits"][0]["score"] <= 1 and first["hits"][0]["ref"]
    assert first["cache"] == {
        "hit": False,
        "source": "computed",
        "similarity": None,
        "cached_query": None,
    }
    # The same question again is answered by the semantic cache, not the index.
    again = await client.post(
        "/query", json={"texts": ["What happens when a worker dies?"], "collection": name, "k": 1}
    )
    (hit,) = again.json()["answers"]
    assert hit["cache"]["hit"] and hit["cache"]["similarity"] >= 0.95
    assert hit["cache"]["cached_query"] == "what happens when a worker dies?"
    assert hit["hits"] == first["hits"]
    off = await client.post(
        "/query",
        json={"texts": ["what happens when a worker dies?"], "collection": name, "cache": False},
    )
    assert off.json()["answers"][0]["cache"] is None
    # Queries share the app's cache: a server does not open pools per request.
    with psycopg.connect(pg_url, autocommit=True) as conn:

        def sessions() -> int:
            return conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            ).fetchone()[0]

        before = sessions()
        for n in range(5):
            r = await client.post(
                "/query", json={"texts": [f"question {n}"], "collection": name, "tenant": f"t{n}"}
            )
            assert r.status_code == 200
        assert sessions() <= before
