"""Bearer tokens, body limits, validation errors, no tracebacks, bind checks."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from herd.api.security import check_bind, is_loopback
from herd.errors import ConfigError
from tests.api.conftest import TOKEN, client_of, herd_env


@pytest.fixture
async def locked(pg_app):
    async with client_of(pg_app, token=TOKEN) as c:
        yield c


@pytest.mark.parametrize(
    "path",
    ["/jobs", "/jobs/1", "/dlq", "/stats", "/overview", "/metrics", "/healthz", "/openapi.json"],
)
async def test_without_the_token_every_data_route_is_401(locked, path):
    r = await locked.get(path)
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    wrong = await locked.get(path, headers={"Authorization": "Bearer " + TOKEN[:-1] + "x"})
    assert wrong.status_code == 401
    basic = await locked.get(path, headers={"Authorization": "Basic " + TOKEN})
    assert basic.status_code == 401


async def test_posts_need_the_token_too_and_the_body_is_not_read_without_it(locked):
    r = await locked.post("/jobs", json={"task": "t"})
    assert r.status_code == 401
    huge = await locked.post("/jobs", content=b"x" * (2 << 20))
    assert huge.status_code == 401  # refused before the body is looked at


async def test_the_right_token_opens_every_route(locked):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = await locked.post("/jobs", json={"task": "t"}, headers=auth)
    assert r.status_code == 201
    for path in ("/jobs", f"/jobs/{r.json()['job_id']}", "/dlq", "/stats", "/overview", "/metrics"):
        assert (await locked.get(path, headers=auth)).status_code == 200, path
    assert (
        await locked.get("/jobs", headers={"authorization": f"bearer {TOKEN}"})
    ).status_code == 200


async def test_the_dashboard_shell_needs_no_token_and_holds_no_data(locked, pg_app):
    await pg_app.enqueue("secret.task", {"s": "hidden"})
    page = await locked.get("/")
    assert page.status_code == 200 and "secret" not in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert (await locked.get("/static/dashboard.js")).status_code == 200
    assert (await locked.get("/static/dashboard.css")).status_code == 200


async def test_a_body_past_the_limit_is_413_whatever_content_length_says(pg_app):
    async with client_of(pg_app, body_limit=1000) as c:
        big = {"task": "t", "payload": "x" * 2000}
        r = await c.post("/jobs", json=big)
        assert r.status_code == 413 and "1000 bytes" in r.json()["error"]

        async def chunks():  # chunked: no Content-Length at all
            for _ in range(10):
                yield b"x" * 200

        r = await c.post("/jobs", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        small = await c.post("/jobs", json={"task": "t", "payload": "x" * 100})
        assert small.status_code == 201
        assert (await c.get("/jobs")).status_code == 200


async def test_a_lying_content_length_does_not_get_past_the_limit(pg_app):
    """Declared small, sent large: the bytes are counted as they arrive."""
    from herd.api import create_app

    api = create_app(pg_app, body_limit=100)
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"{" + b" " * 500 + b"}", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/jobs",
        "headers": [(b"content-length", b"10"), (b"content-type", b"application/json")],
        "query_string": b"",
    }
    async with api.router.lifespan_context(api):
        await api(scope, receive, send)
    assert sent[0]["status"] == 413


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"payload": 1}, "task"),
        ({"task": ""}, "task"),
        ({"task": "t", "priority": "high"}, "priority"),
        ({"task": "t", "queue": "a{b}"}, "queue"),
        ({"task": "t", "delay": -1}, "delay"),
        ({"task": "t", "unknown": 1}, "unknown"),
    ],
)
async def test_validation_errors_are_422_with_field_and_reason(client, body, field):
    r = await client.post("/jobs", json=body)
    assert r.status_code == 422
    (error,) = r.json()["errors"]
    assert error["field"] == field and error["location"] == "body" and error["reason"]


async def test_query_parameters_and_bodies_that_are_not_json_are_422(client):
    r = await client.get("/jobs", params={"status": "exploded", "limit": 0})
    assert r.status_code == 422
    assert {e["field"] for e in r.json()["errors"]} == {"status", "limit"}
    r = await client.post(
        "/jobs", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 422
    r = await client.post("/dlq/requeue", json={"job_ids": [1], "all": True})
    assert r.status_code == 422 and "not both" in r.json()["errors"][0]["reason"]


async def test_an_unexpected_error_is_a_500_without_traceback(pg_app, caplog):
    from herd.api import create_app

    api = create_app(pg_app)

    async def boom() -> None:
        raise RuntimeError("secret detail in /srv/x.py")

    api.add_api_route("/boom", boom)
    async with api.router.lifespan_context(api):
        transport = httpx.ASGITransport(app=api, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            r = await c.get("/boom")
    assert r.status_code == 500
    assert "secret" not in r.text and "Traceback" not in r.text and "RuntimeError" not in r.text
    ref = r.json()["error"].split("reference ")[1].split()[0]
    assert any(ref in rec.getMessage() and rec.exc_info for rec in caplog.records)


async def test_a_store_that_is_down_is_503_without_detail(pg_url, herd_home):
    from herd.app import App
    from herd.config import Settings

    app = App(settings=Settings(home=herd_home, database_url=pg_url))
    async with client_of(app) as c:
        await app.broker.close()
        r = await c.get("/jobs")
    assert r.status_code == 503
    assert r.json() == {"error": "the job store is unavailable"}


async def test_job_ids_out_of_range_are_422(client):
    assert (await client.get(f"/jobs/{2**63}")).status_code == 422
    assert (await client.get("/jobs/0")).status_code == 422


async def test_security_headers_on_every_answer(client):
    r = await client.get("/jobs/1")
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"


def test_loopback_addresses():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", "t")
    with pytest.raises(ConfigError, match="HERD_API_TOKEN"):
        check_bind("0.0.0.0", None)


def test_serve_beyond_loopback_without_a_token_exits_2_with_one_line(pg_url, herd_home):
    done = subprocess.run(
        [sys.executable, "-m", "herd", "serve", "--host", "0.0.0.0", "--port", "1"],
        env=herd_env(pg_url, herd_home),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "HERD_API_TOKEN" in lines[0], done.stderr


def test_a_real_server_answers_over_tcp(server):
    r = httpx.get(server + "/healthz")
    assert r.status_code == 200 and r.json()["checks"]["database"] == "ok"
    assert "server" not in r.headers
