"""Batches have owners (issue 29, item 8): only the caller that made a batch, or the
admin token, changes it; a name another caller made is refused; a page of another site
cannot change anything through a visitor's browser."""

from __future__ import annotations

from pathlib import Path

import pytest

from herd.app import App
from herd.config import Settings, TenantToken
from herd.errors import BatchNameTaken
from herd.llm.eval import Caller, EvalSpec, enqueue_documents
from tests.api.conftest import TOKEN, client_of
from tests.conftest import truncate
from tests.helpers import priced
from tests.llm.conftest import clean_eval_tables

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789abc"
SPEC = {"model": "sim-small", "system": "Summarize the document as JSON.",
        "schema": {"type": "object"}}  # fmt: skip


def body(batch: str, **extra: object) -> dict[str, object]:
    return {**SPEC, "documents": [{"name": "a.txt", "text": "Owned."}], "batch": batch, **extra}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def tenants_app(pg_url: str, herd_home: Path, monkeypatch, tmp_path):
    truncate(pg_url)
    priced(monkeypatch, tmp_path, SPEC["model"])
    settings = Settings(
        home=herd_home, database_url=pg_url, api_token=TOKEN,
        api_tokens=(TenantToken(ALICE, frozenset({"a"})), TenantToken(BOB, frozenset({"b"}))),
    )  # fmt: skip
    async with App(settings=settings) as app:
        clean_eval_tables(pg_url)
        yield app


async def test_only_the_owner_or_the_admin_changes_a_batch(tenants_app):
    async with client_of(tenants_app) as c:
        made = await c.post("/evals", json=body("owned", budget=1e-05, rpm=5), headers=auth(ALICE))
        assert made.status_code == 201, made.text
        for path, payload in [("budget", {"budget": 1e9}), ("resume", None), ("cancel", None)]:
            r = await c.post(f"/evals/owned/{path}", json=payload, headers=auth(BOB))
            assert r.status_code == 403, (path, r.text)
        for path in ("", "/results"):
            r = await c.get(f"/evals/owned{path}", headers=auth(BOB))
            assert r.status_code == 403, (path, r.text)
        # Another caller's submission under the name is refused and changes nothing.
        taken = await c.post("/evals", json=body("owned", budget=1e9, rpm=1000),
                             headers=auth(BOB))  # fmt: skip
        assert taken.status_code == 409, taken.text
        status = (await c.get("/evals/owned", headers=auth(ALICE))).json()
        assert status["budget"] == 1e-05 and status["limits"] == {"rpm": 5}
        # The owner's own second submission may change them.
        again = await c.post("/evals", json=body("owned", budget=0.5), headers=auth(ALICE))
        assert again.status_code == 201, again.text
        r = await c.post("/evals/owned/budget", json={"budget": 0.25}, headers=auth(ALICE))
        assert r.status_code == 200 and r.json()["budget"] == 0.25
        # The admin token changes any batch.
        r = await c.post("/evals/owned/budget", json={"budget": 2.0}, headers=auth(TOKEN))
        assert r.status_code == 200 and r.json()["budget"] == 2.0
        r = await c.post("/evals/owned/cancel", headers=auth(TOKEN))
        assert r.status_code == 200, r.text
        # Listing every batch stays the admin's.
        assert (await c.get("/evals", headers=auth(ALICE))).status_code == 403


async def test_a_name_the_cli_made_is_refused_to_an_api_caller(tenants_app):
    spec = EvalSpec(model=SPEC["model"], system=SPEC["system"], schema=SPEC["schema"])
    await enqueue_documents(tenants_app, spec, "local-one", [("a.txt", "Local.")], budget=1.0)
    async with client_of(tenants_app) as c:
        r = await c.post("/evals", json=body("local-one", budget=1e9), headers=auth(ALICE))
        assert r.status_code == 409, r.text
        r = await c.post("/evals/local-one/cancel", headers=auth(ALICE))
        assert r.status_code == 403, r.text
    # ... and a Python caller under another owner is refused as well.
    with pytest.raises(BatchNameTaken):
        await enqueue_documents(tenants_app, spec, "local-one", [("b.txt", "Other.")],
                                caller=Caller("token:someone"))  # fmt: skip


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "http://127.0.0.1:9999"},  # another port: another origin
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # another local app on another port
    ],
)
async def test_a_cross_site_request_changes_nothing(pg_app, client, headers):
    spec = EvalSpec(model=SPEC["model"], system=SPEC["system"], schema=SPEC["schema"])
    await enqueue_documents(pg_app, spec, "victim", [("a.txt", "Victim.")])
    r = await client.post("/evals/victim/cancel", headers=headers)
    assert r.status_code == 403 and "cross-site" in r.json()["error"], r.text
    status = (await client.get("/evals/victim", headers=headers)).json()  # reads stay open
    assert status["parked"] is None
    # The server's own page (and a client that is not a browser) may.
    own = {"Origin": "http://127.0.0.1:8000", "Sec-Fetch-Site": "same-origin"}
    assert (await client.post("/evals/victim/cancel", headers=own)).status_code == 200


async def test_a_json_body_without_a_json_content_type_is_refused(pg_app, client):
    # A browser sends text/plain cross-site without asking first (FastAPI >= 0.132).
    spec = EvalSpec(model=SPEC["model"], system=SPEC["system"], schema=SPEC["schema"])
    await enqueue_documents(pg_app, spec, "typed", [("a.txt", "Typed.")])
    for headers in ({"Content-Type": "text/plain"}, {}):
        r = await client.post("/evals/typed/budget", content=b'{"budget": 5}', headers=headers)
        assert r.status_code == 422, r.text
    assert (await client.get("/evals/typed")).json()["budget"] is None
