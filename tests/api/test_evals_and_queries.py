"""Evaluations submitted over HTTP; retrieval over a corpus indexed for real."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from herd.builtin import tasks as builtin_tasks
from herd.errors import InvalidInput
from herd.llm.eval import EvalSpec, enqueue_documents
from herd.rag.ingest import plan_and_apply
from herd.rag.query import answer
from tests.helpers import priced
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


NUL, SURROGATE = "a\x00b", "a\ud800b"


def _eval_with(where: str, bad: str) -> dict[str, object]:
    body: dict[str, object] = {**SPEC, "documents": [{"name": "a.txt", "text": "fine"}]}
    if where.startswith("documents."):
        body["documents"] = [{"name": "a.txt", "text": "fine", where.split(".")[-1]: bad}]
    elif where.startswith("schema.") or where.startswith("params."):
        top, key = where.split(".")
        body[top] = {key: bad}
    else:
        body[where] = bad
    return body


def _json(body: object) -> bytes:
    """The body as a client sends it: json.dumps escapes a lone surrogate, httpx would fail."""
    import json

    return json.dumps(body).encode()


@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "surrogate"])
@pytest.mark.parametrize(
    ("where", "field"),
    [
        ("model", "model"),
        ("system", "system"),
        ("batch", "batch"),
        ("documents.name", "documents.0.name"),
        ("documents.text", "documents.0.text"),
        ("schema.title", "schema"),
        ("params.stop", "params"),
    ],
)
async def test_bad_characters_in_an_eval_are_422_naming_the_field(client, where, field, bad):
    r = await client.post(
        "/evals",
        content=_json(_eval_with(where, bad)),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422, r.text
    (error,) = r.json()["errors"]
    assert error["field"] == field, error
    assert ("NUL" if bad == NUL else "surrogate") in error["reason"]


@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "surrogate"])
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"texts": ["ok", "BAD"]}, "texts.1"),
        ({"texts": ["ok"], "collection": "BAD"}, "collection"),
        ({"texts": ["ok"], "tenant": "BAD"}, "tenant"),
    ],
)
async def test_bad_characters_in_a_query_are_422_naming_the_field(client, body, field, bad):
    sent = {
        k: [bad if t == "BAD" else t for t in v] if k == "texts" else bad if v == "BAD" else v
        for k, v in body.items()
    }
    r = await client.post(
        "/query", content=_json(sent), headers={"content-type": "application/json"}
    )
    assert r.status_code == 422, r.text
    (error,) = r.json()["errors"]
    assert error["field"] == field and "position 1" in error["reason"], error


async def test_a_nul_in_the_batch_of_a_status_url_is_422(client):
    r = await client.get("/evals/a%00b")
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "batch"


async def test_a_literal_backslash_u0000_is_text_and_accepted(client):
    text = "a literal \\u0000 is six characters"
    docs = [{"name": "lit\\u0000.txt", "text": text}]
    r = await client.post("/evals", json={**SPEC, "system": text, "documents": docs})
    assert r.status_code == 201, r.text
    q = await client.post("/query", json={"texts": [text], "collection": "none\\u0000"})
    assert q.status_code == 404  # past validation: the collection simply has no index


@pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "surrogate"])
async def test_the_python_entry_points_refuse_bad_characters(pg_app, bad):
    spec = EvalSpec(model="m", system="s")
    with pytest.raises(InvalidInput, match="batch"):
        await enqueue_documents(pg_app, spec, bad, [("a.txt", "fine")])
    with pytest.raises(InvalidInput, match="name"):
        await enqueue_documents(pg_app, spec, "b", [(bad, "fine")])
    with pytest.raises(InvalidInput, match="text"):
        await enqueue_documents(pg_app, spec, "b", [("a.txt", bad)])
    with pytest.raises(InvalidInput, match="system"):
        await enqueue_documents(pg_app, EvalSpec(model="m", system=bad), "b", [("a", "t")])
    with pytest.raises(InvalidInput, match="collection"):
        await answer(pg_app, bad, ["q"], 1)
    with pytest.raises(InvalidInput, match=r"queries\[0\]"):
        await answer(pg_app, "default", [bad], 1)
    with pytest.raises(InvalidInput, match="tenant"):
        await answer(pg_app, "default", ["q"], 1, tenant=bad)


async def test_an_eval_priority_out_of_range_is_422_not_a_database_error(client):
    r = await client.post(
        "/evals", json={**SPEC, "documents": [{"name": "a", "text": "t"}], "priority": 2**63}
    )
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "priority"


async def test_an_eval_batch_keeps_its_budget_and_limits_and_the_budget_can_change(
    client, monkeypatch, tmp_path
):
    priced(monkeypatch, tmp_path, SPEC["model"])
    body = {**SPEC, "documents": [{"name": "a.txt", "text": "Budgets."}], "batch": "api-budget"}
    limits = {"rpm": 10, "tpm": 1000, "max_concurrent": 2, "weight": 3}
    r = await client.post("/evals", json={**body, "budget": 0.5, **limits})
    assert r.status_code == 201, r.text
    status = (await client.get("/evals/api-budget")).json()
    assert status["budget"] == 0.5 and status["spent"] == 0.0 and status["limits"] == limits
    assert status["weight"] == 3 and status["share"] is None  # no call yet
    changed = await client.post("/evals/api-budget/budget", json={"budget": 2.5})
    assert changed.status_code == 200, changed.text
    out = changed.json()
    assert out == {"batch": "api-budget", "budget": 2.5, "spent": 0.0, "reserved": 0.0,
                   "parked": None, "resumed": 0}  # fmt: skip
    status = (await client.get("/evals/api-budget")).json()
    assert status["budget"] == 2.5 and status["limits"] == limits
    lifted = await client.post("/evals/api-budget/budget", json={"budget": None})
    assert lifted.status_code == 200 and lifted.json()["budget"] is None


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("budget", -1),
        ("budget", "lots"),
        ("rpm", 0),
        ("tpm", 1.5),
        ("max_concurrent", 0),
        ("weight", 0),
        ("weight", 1001),
    ],  # fmt: skip
)
async def test_a_bad_eval_budget_or_limit_is_422_naming_the_field(client, field, bad):
    body = {**SPEC, "documents": [{"name": "a.txt", "text": "x"}], "batch": "api-bad", field: bad}
    r = await client.post("/evals", json=body)
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["errors"]] == [field]
    assert (await client.get("/evals/api-bad")).status_code == 404  # nothing was made


async def test_the_budget_of_an_unknown_batch_is_404_and_a_bad_one_422(client):
    r = await client.post("/evals/no-such-batch/budget", json={"budget": 1.0})
    assert r.status_code == 404, r.text
    assert "no batch named 'no-such-batch'" in r.json()["error"]
    bad = await client.post("/evals/no-such-batch/budget", json={"budget": -1})
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "budget"


async def test_query_modes_over_http(client, pg_app, tmp_path, herd_home):
    name = f"c{uuid.uuid4().hex[:10]}"
    kjv = tmp_path / "kjv.txt"
    kjv.write_text(
        "Genesis 5:25 And Methuselah lived an hundred eighty and seven years, and begat Lamech.\n"
        "Genesis 5:26 And Methuselah lived after he begat Lamech seven hundred eighty and two"
        " years.\nGenesis 1:3 And God said, Let there be light: and there was light.\n"
    )
    pg_app.settings = pg_app.settings.override(home=herd_home)
    pg_app.include(builtin_tasks)
    await plan_and_apply(pg_app, [kjv], name)
    await drain(pg_app)

    async def top(text: str, **extra) -> list[dict]:
        body = {"texts": [text], "collection": name, "cache": False, **extra}
        r = await client.post("/query", json=body)
        assert r.status_code == 200, r.text
        return r.json()["answers"][0]["hits"]

    # Lexical: only chunks sharing a word, scored by BM25 (not a cosine).
    lexical = await top("Lamech", mode="lexical")
    assert {h["id"] for h in lexical} == {"kjv/genesis/5/25", "kjv/genesis/5/26"}
    assert (await top("seven hundred eighty two", mode="lexical"))[0]["id"] == "kjv/genesis/5/26"
    dense = await top("Lamech", mode="dense")
    assert len(dense) == 3  # every chunk has a cosine
    # A reference comes first in any mode.
    assert (await top("Genesis 1:3", mode="lexical"))[0]["id"] == "kjv/genesis/1/3"
    bad = await client.post("/query", json={"texts": ["x"], "collection": name, "mode": "bm25"})
    assert bad.status_code == 422 and "mode" in bad.text
