"""Tokens bound to tenants (HERD_API_TOKENS): a tenant's client queries as its tenants
only, and calls nothing but /query; an unbound token (HERD_API_TOKEN) queries as any."""

from __future__ import annotations

import json
import uuid

import pytest

from herd.api.security import check_bind, weakest
from herd.builtin import tasks as builtin_tasks
from herd.config import Settings, TenantToken
from herd.errors import ConfigError
from herd.rag.ingest import plan_and_apply
from tests.api.conftest import TOKEN, client_of
from tests.rag.test_ingest import drain
from tests.test_cli import herd

ACME = "acme-token-0123456789"
TWO = "two-tenants-token-0123456789"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def bind(pg_app, *, unbound: str | None = TOKEN) -> None:
    pg_app.settings = pg_app.settings.override(
        api_token=unbound,
        api_tokens=(
            TenantToken(ACME, frozenset({"acme"})),
            TenantToken(TWO, frozenset({"globex", "initech"})),
        ),
    )


async def test_a_bound_token_queries_as_its_tenants_only(pg_app):
    bind(pg_app)
    async with client_of(pg_app, token=TOKEN) as c:

        async def status(token: str, **body: object) -> int:
            sent = {"texts": ["light"], "collection": "nowhere", **body}
            return (await c.post("/query", json=sent, headers=bearer(token))).status_code

        refused = await c.post(
            "/query", json={"texts": ["light"], "tenant": "globex"}, headers=bearer(ACME)
        )
        assert refused.status_code == 403
        assert refused.json()["error"] == (
            "this token may query as acme only, not as 'globex': name one"
        )
        # 404: past the tenant's check, to the collection that has no index.
        assert await status(ACME, tenant="acme") == 404
        assert await status(ACME) == 404  # its one tenant, unnamed
        assert await status(TWO, tenant="initech") == 404
        assert await status(TWO) == 403  # two tenants: the request names one
        assert await status(TWO, tenant="acme") == 403
        assert await status(TOKEN, tenant="globex") == 404  # HERD_API_TOKEN: any tenant


async def test_a_bound_token_calls_nothing_but_query(pg_app):
    bind(pg_app)
    async with client_of(pg_app, token=TOKEN) as c:
        # GET /evals lists every caller's batches: the admin's. The routes of one batch
        # are open to it, on batches it made only (tests/api/test_batch_owners.py).
        for method, path in [("GET", "/jobs"), ("GET", "/overview"), ("POST", "/jobs"),
                             ("GET", "/evals")]:  # fmt: skip
            r = await c.request(method, path, json={"task": "t"}, headers=bearer(ACME))
            assert r.status_code == 403, path
            assert r.json()["error"] == (
                "this token is bound to tenants: it may call POST /query, GET /healthz"
                " and the evaluations' routes of batches it made only"
            )
        assert (await c.get("/healthz", headers=bearer(ACME))).status_code == 200
        assert (await c.get("/jobs", headers=bearer(TOKEN))).status_code == 200
        assert (await c.get("/jobs", headers=bearer("acme-token-012345678x"))).status_code == 401


async def test_bound_tokens_alone_lock_the_api_and_serve_other_machines(pg_app):
    bind(pg_app, unbound=None)
    async with client_of(pg_app, peer=("203.0.113.9", 4000)) as c:
        assert (await c.get("/jobs")).status_code == 401
        r = await c.post("/query", json={"texts": ["x"], "collection": "no"}, headers=bearer(ACME))
        assert r.status_code == 404, r.text
    check_bind("0.0.0.0", weakest(pg_app.settings.bearer_tokens()))


async def test_the_tenant_of_a_bound_token_is_the_semantic_caches_tenant(
    pg_app, tmp_path, herd_home
):
    name = f"c{uuid.uuid4().hex[:10]}"
    corpus = tmp_path / "notes.md"
    corpus.write_text(
        "# Leases\n\nA lease that is not renewed expires; another worker takes over.\n"
    )
    pg_app.settings = pg_app.settings.override(home=herd_home)
    pg_app.include(builtin_tasks)
    await plan_and_apply(pg_app, [corpus], name)
    await drain(pg_app)
    bind(pg_app)
    query = {"texts": ["what happens to a lease?"], "collection": name, "k": 1}
    async with client_of(pg_app, token=TOKEN) as c:
        first = await c.post("/query", json=query, headers=bearer(ACME))
        assert first.status_code == 200, first.text
        assert not first.json()["answers"][0]["cache"]["hit"]

        async def hit(tenant: str) -> bool:
            r = await c.post("/query", json={**query, "tenant": tenant}, headers=bearer(TOKEN))
            return bool(r.json()["answers"][0]["cache"]["hit"])

        assert await hit("acme") and not await hit("default")


def test_the_setting_reads_entries_and_never_shows_a_token():
    env = {"HERD_API_TOKENS": f"{ACME}=acme;\n {TWO}=globex,initech "}
    settings = Settings.from_env(env)
    assert settings.api_tokens == (
        TenantToken(ACME, frozenset({"acme"})),
        TenantToken(TWO, frozenset({"globex", "initech"})),
    )
    assert settings.bearer_tokens() == [ACME, TWO]
    shown = settings.masked()["api_tokens"]
    assert shown == "****=acme; ****=globex,initech"
    assert ACME not in repr(settings) and TWO not in repr(settings)
    printed = herd("config", "--json", **env)
    assert json.loads(printed.stdout)["api_tokens"] == shown
    assert ACME not in printed.stdout + printed.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("acme-token-0123456789", "entry 1 is not TOKEN=TENANT[,TENANT...]"),
        (f"{ACME}=acme {TWO}=a,,b", "entry 2 is not TOKEN=TENANT"),
        ("short=acme", "entry 1: its token has 5 characters; a token needs at least 16"),
        (f"{ACME}=a {ACME}=b", "entry 2: its token is given twice"),
        (f"{TOKEN}=acme", "entry 1: its token is given twice (or is HERD_API_TOKEN"),
    ],
)
def test_a_bad_entry_is_refused_by_its_number_not_its_text(value, message):
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"HERD_API_TOKENS": value, "HERD_API_TOKEN": TOKEN})
    text = str(caught.value)
    assert text.startswith("HERD_API_TOKENS: ") and message in text
    assert ACME not in text and TOKEN not in text and "short" not in text
