"""Bearer tokens, host names, client addresses, body limits, validation errors, no
tracebacks, bind checks, security headers, /docs without a CDN."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from html.parser import HTMLParser

import httpx
import pytest

from herd.api.security import check_bind, host_name, is_loopback
from herd.config import Settings
from herd.errors import ConfigError
from herd.queue.base import DeadReason, Failure
from tests.api.conftest import TOKEN, client_of, herd_env, serving


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
        "headers": [
            (b"host", b"localhost"),
            (b"content-length", b"10"),
            (b"content-type", b"application/json"),
        ],
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
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            r = await c.get("/boom")
    assert r.status_code == 500
    assert "secret" not in r.text and "Traceback" not in r.text and "RuntimeError" not in r.text
    # Starlette sends a 500 outside the middleware: the headers must be there all the same.
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["content-security-policy"].startswith("default-src 'none'")
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


SECURITY_HEADERS = (
    "x-content-type-options",
    "x-frame-options",
    "referrer-policy",
    "cache-control",
    "content-security-policy",
)


async def test_security_headers_on_every_answer(pg_app):
    async with client_of(pg_app, body_limit=100) as c:
        answers = [
            await c.get("/jobs/1"),  # 404
            await c.get("/no/such/route"),
            await c.post("/jobs", json={"task": ""}),  # 422
            await c.post("/jobs", json={"task": "t", "payload": "x" * 200}),  # 413
            await c.get("/healthz"),
            await c.get("/metrics"),
            await c.get("/openapi.json"),
            await c.get("/docs"),
            await c.get("/static/dashboard.js"),
            await c.get("/jobs", headers={"host": "rebind.attacker.example"}),  # 400
        ]
    async with client_of(pg_app, token=TOKEN) as c:
        answers.append(await c.get("/jobs"))  # 401
    async with client_of(pg_app, peer=("203.0.113.9", 4000)) as c:
        answers.append(await c.get("/jobs"))  # 403
    for r in answers:
        for name in SECURITY_HEADERS:
            assert name in r.headers, (r.request.url, r.status_code, name)
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers.get_list("content-security-policy") == [
            r.headers["content-security-policy"]
        ], "one policy, not two"
    assert [r.status_code for r in answers[-3:]] == [400, 401, 403]


async def test_the_dashboard_keeps_its_own_policy(client):
    page = await client.get("/")
    assert page.headers.get_list("content-security-policy") == [
        page.headers["content-security-policy"]
    ]
    assert "script-src 'self'" in page.headers["content-security-policy"]


def test_loopback_addresses():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    check_bind("127.0.0.1", None)
    check_bind("0.0.0.0", TOKEN)
    with pytest.raises(ConfigError, match="HERD_API_TOKEN"):
        check_bind("0.0.0.0", None)


def test_a_short_token_is_refused_off_loopback_only():
    check_bind("127.0.0.1", "short")
    check_bind("::1", "short")
    with pytest.raises(ConfigError, match="at least 16"):
        check_bind("0.0.0.0", "fifteen-chars!!")
    check_bind("0.0.0.0", "sixteen-chars!!!")


def test_serve_off_loopback_with_a_short_token_exits_2_with_one_line(pg_url, herd_home):
    done = subprocess.run(
        [sys.executable, "-m", "herd", "serve", "--host", "0.0.0.0", "--port", "1"],
        env=herd_env(pg_url, herd_home, HERD_API_TOKEN="short"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "at least 16" in lines[0], done.stderr


def test_the_configured_token_is_trimmed_like_the_header():
    settings = Settings.from_env({"HERD_API_TOKEN": f"  {TOKEN}\n"})
    assert settings.api_token == TOKEN
    assert Settings.from_env({"HERD_API_TOKEN": " \n"}).api_token is None


async def test_a_token_pasted_with_its_newline_still_matches(pg_app):
    async with client_of(pg_app, token=f"{TOKEN}\n") as c:
        r = await c.get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
        assert (await c.get("/jobs", headers={"Authorization": "Bearer "})).status_code == 401


# --- who may call: client addresses (the rule of the app, not only of `herd serve`) ---


async def test_without_a_token_only_loopback_clients_are_answered(pg_app):
    async with client_of(pg_app, peer=("203.0.113.9", 4000)) as c:
        r = await c.post("/jobs", json={"task": "t"})
        assert r.status_code == 403 and "HERD_API_TOKEN" in r.json()["error"]
        assert (await c.get("/")).status_code == 403
    assert await pg_app.list_jobs() == []
    for peer in ("127.0.0.1", "127.3.4.5", "::1"):
        async with client_of(pg_app, peer=(peer, 4000)) as c:
            assert (await c.get("/jobs")).status_code == 200, peer


async def test_a_short_token_serves_loopback_clients_only(pg_app):
    short = "short-token"
    auth = {"Authorization": f"Bearer {short}"}
    async with client_of(pg_app, token=short, peer=("203.0.113.9", 4000)) as c:
        assert (await c.get("/jobs", headers=auth)).status_code == 403
    async with client_of(pg_app, token=short) as c:
        assert (await c.get("/jobs", headers=auth)).status_code == 200
        assert (await c.get("/jobs")).status_code == 401
    async with client_of(pg_app, token=TOKEN, peer=("203.0.113.9", 4000)) as c:
        r = await c.get("/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200


def _outside_address() -> str | None:
    """This machine's address on a non-loopback interface, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # a UDP connect sends nothing; it picks the route
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if is_loopback(address) or address == "0.0.0.0" else address


def test_uvicorn_factory_on_all_interfaces_without_a_token_refuses_other_machines(
    pg_url, herd_home, tmp_path
):
    """`uvicorn --factory` skips the CLI's bind check: the app refuses by itself."""
    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback address to call from")
    uvicorn = [sys.executable, "-m", "uvicorn", "--factory", "herd.api.app:create_app"]
    with serving(
        pg_url, herd_home, tmp_path / "uv.log", command=[*uvicorn, "--host", "0.0.0.0"]
    ) as url:
        port = url.rsplit(":", 1)[1]
        far = httpx.post(f"http://{outside}:{port}/jobs", json={"task": "t"}, timeout=10)
        assert far.status_code == 403, far.text
        assert httpx.get(f"http://{outside}:{port}/", timeout=10).status_code == 403
        near = httpx.get(url + "/jobs", timeout=10)
        assert near.status_code == 200 and near.json() == []


# --- which Host names (DNS rebinding) ---


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8000", "localhost"),
        ("LocalHost", "localhost"),
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]:8000", "[::1]"),
        ("herd.example.org.", "herd.example.org"),
        ("[::1", None),
        ("a:b", None),
        ("", None),
    ],
)
def test_host_names(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize("host", ["rebind.attacker.example", "rebind.attacker.example:8000", ""])
async def test_without_a_token_a_foreign_host_name_cannot_enqueue_or_requeue(pg_app, host):
    await pg_app.enqueue("t", queue="q")
    (lease,) = await pg_app.broker.claim(["q"], "w", 1)
    await pg_app.broker.fail_if_leased(Failure(lease, "E", final=True, reason=DeadReason.FATAL))
    async with client_of(pg_app) as c:
        headers = {"host": host}
        r = await c.post("/jobs", json={"task": "t2"}, headers=headers)
        assert r.status_code == 400 and "Host" in r.json()["error"], r.text
        assert "HERD_API_TRUSTED_HOSTS" in r.json()["error"]
        r = await c.post("/dlq/requeue", json={"all": True}, headers=headers)
        assert r.status_code == 400
        assert (await c.get("/overview", headers=headers)).status_code == 400
    assert [j.task for j in await pg_app.list_jobs()] == ["t"]
    assert len(await pg_app.dead_letters()) == 1


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST:1"]
)
async def test_without_a_token_loopback_names_are_answered(client, host):
    assert (await client.get("/jobs", headers={"host": host})).status_code == 200


async def test_with_a_token_any_name_unless_a_trusted_list_is_set(pg_app):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with client_of(pg_app, token=TOKEN) as c:
        r = await c.get("/jobs", headers={**auth, "host": "herd.internal:8000"})
        assert r.status_code == 200
    trusted = ["herd.example.org", "*.herd.example.net"]
    async with client_of(pg_app, token=TOKEN, trusted_hosts=trusted) as c:
        for ok in ("herd.example.org", "HERD.example.org:443", "a.herd.example.net", "localhost"):
            assert (await c.get("/jobs", headers={**auth, "host": ok})).status_code == 200, ok
        for bad in ("evil.example.org", "herd.example.net", "xherd.example.org"):
            r = await c.get("/jobs", headers={**auth, "host": bad})
            assert r.status_code == 400, bad
            assert "HERD_API_TRUSTED_HOSTS" in r.json()["error"]


async def test_without_a_token_the_trusted_list_adds_names(pg_app):
    async with client_of(pg_app, trusted_hosts=["herd.lan"]) as c:
        assert (await c.get("/jobs", headers={"host": "herd.lan:8000"})).status_code == 200
        assert (await c.get("/jobs", headers={"host": "other.lan"})).status_code == 400


def test_the_trusted_hosts_setting():
    env = {"HERD_API_TRUSTED_HOSTS": " Herd.Example.org, *.lan ,,[::2]"}
    assert Settings.from_env(env).api_trusted_hosts == ("herd.example.org", "*.lan", "[::2]")
    assert Settings.from_env({}).api_trusted_hosts == ()
    for bad in ("http://herd.example.org", "herd.example.org:8000", "a/b", "a*b.org"):
        with pytest.raises(ConfigError, match="HERD_API_TRUSTED_HOSTS"):
            Settings.from_env({"HERD_API_TRUSTED_HOSTS": bad})


def test_serve_with_a_bad_trusted_host_exits_2_with_one_line(pg_url, herd_home):
    done = subprocess.run(
        [sys.executable, "-m", "herd", "serve", "--port", "1"],
        env=herd_env(pg_url, herd_home, HERD_API_TRUSTED_HOSTS="herd.lan,https://x.org"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "HERD_API_TRUSTED_HOSTS" in lines[0] and "x.org" in lines[0]


def test_a_real_server_refuses_a_rebound_host_name(server):
    r = httpx.post(server + "/jobs", json={"task": "t"}, headers={"host": "rebind.example"})
    assert r.status_code == 400
    assert httpx.get(server + "/jobs", headers={"host": "localhost"}).json() == []


# --- /docs: served from this server, nothing from a CDN ---


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.refs += [v for k, v in attrs if k in ("src", "href") and v]


async def test_docs_load_their_assets_from_this_server_only(client):
    page = await client.get("/docs")
    assert page.status_code == 200
    assert not re.search(r"https?://|//[a-z]", page.text, re.I), "an external URL in /docs"
    csp = page.headers["content-security-policy"]
    assert "http" not in csp and "*" not in csp, csp
    policy = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert policy["script-src"] == "'self'" and policy["connect-src"] == "'self'"
    parser = _Refs()
    parser.feed(page.text)
    kinds = {}
    for ref in parser.refs:
        assert ref.startswith("/"), ref
        asset = await client.get(ref)
        assert asset.status_code == 200, ref
        kinds[ref.rsplit(".", 1)[-1]] = asset.headers["content-type"]
    assert kinds["js"].startswith(("text/javascript", "application/javascript"))
    assert kinds["css"].startswith("text/css")
    bundle = next(r for r in parser.refs if r.endswith("swagger-ui-bundle.js"))
    assert "SwaggerUIBundle" in (await client.get(bundle)).text


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


@pytest.mark.parametrize(
    "body",
    [b"\x80\x81", b"[" * 100_000, b'{"task": "' + b"\xc3" + b'"}'],
    ids=["bytes", "deep", "cut"],
)
async def test_a_body_that_is_not_json_text_is_a_4xx_in_herds_shape(client, body):
    """Found by tests/api/test_fuzz.py: FastAPI answered {"detail": ...}, not the schema."""
    for path in ("/jobs", "/evals", "/query"):
        r = await client.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code in (400, 422), (path, r.status_code)
        assert isinstance(r.json()["error"], str) and "detail" not in r.json()


async def test_unknown_routes_and_methods_answer_in_herds_shape(client):
    r = await client.get("/no/such/route")
    assert r.status_code == 404 and r.json() == {"error": "Not Found"}
    r = await client.delete("/jobs")
    assert r.status_code == 405 and "error" in r.json() and r.headers["allow"]


@pytest.mark.timeout(1200)  # the first run on a fresh machine installs chromium
def test_docs_render_in_a_browser_under_their_policy(server, tmp_path):
    """The policy holds no CDN and no inline script: Swagger UI must still run under it."""
    from playwright.sync_api import expect, sync_playwright

    from tests.api.browser import ensure_chromium

    chromium, why = ensure_chromium()
    if chromium is None:
        pytest.skip(f"no browser for the /docs test: {why}")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda m: m.type == "error" and errors.append(m.text))
            outside: list[str] = []
            page.on(
                "request",
                lambda r: (
                    r.url.startswith(server) or r.url.startswith("data:") or outside.append(r.url)
                ),
            )
            page.goto(server + "/docs")
            expect(page.locator(".opblock-summary-path").first).to_be_visible()
            expect(page.locator("#swagger-ui")).to_contain_text("/evals/{batch}")
            page.screenshot(path=str(tmp_path / "docs.png"), full_page=True)
            assert errors == [] and outside == []
        finally:
            browser.close()
