"""Credentials never show: every form, through every path that prints, logs, stores or
serves a URL or an error (the CLI's error line, `herd config`, /healthz, a log record,
a dead-lettered job's last_error and last_traceback read back over the API)."""

from __future__ import annotations

import io
import json
import logging
import time
from pathlib import Path

import httpx
import pytest

from herd import App, Worker
from herd.config import Settings, mask_url
from herd.console import mask_logs
from herd.llm import OpenAICompatible, RetryPolicy
from herd.masking import MaskingFilter, mask
from herd.queue.postgres import PostgresBroker
from tests.api.conftest import client_of, free_port, serving
from tests.conftest import truncate
from tests.test_cli import herd

SECRET = "Hunter2-s3cr3t"

# Each form of a PostgreSQL URL with a password, pointed where nothing answers.
DATABASE_FORMS = {
    "userinfo": f"postgresql://herd:{SECRET}@127.0.0.1:9/db",
    "multi-host": f"postgresql://herd:{SECRET}@127.0.0.1:9,127.0.0.1:10/db",
    "slash in password": f"postgresql://herd:pa/{SECRET}@127.0.0.1:9/db",
    "at in password": f"postgresql://herd:p@{SECRET}@127.0.0.1:9/db",
    "colon in password": f"postgresql://herd:p:{SECRET}@127.0.0.1:9/db",
    "query password": f"postgresql://127.0.0.1:9/db?user=herd&password={SECRET}",
    "query sslpassword": f"postgresql://127.0.0.1:9/db?sslpassword={SECRET}&sslmode=disable",
    "libpq keywords": f"host=127.0.0.1 port=9 user=herd password={SECRET} dbname=db",
    "libpq quoted": f"host=127.0.0.1 port=9 password='{SECRET} x' dbname=db",
}
REDIS_FORMS = {
    "password only": f"redis://:{SECRET}@127.0.0.1:9/0",
    "user and password": f"redis://default:{SECRET}@127.0.0.1:9/0",
    "slash in password": f"redis://:pa/{SECRET}@127.0.0.1:9/0",
    "query password": f"redis://127.0.0.1:9/0?password={SECRET}",
}
# Free text an error or a traceback may carry.
TEXT_FORMS = {
    "provider base URL": f"ConnectError talking to http://user:{SECRET}@llm.internal:8/v1",
    "api_key parameter": f"GET https://llm.internal/v1/models?api_key={SECRET}&x=1",
    "token parameter": f"GET /jobs?token={SECRET}",
    "repr of settings": f"Settings(api_token='{SECRET}', max_tokens=5)",
    "dict repr": f"{{'password': '{SECRET}', 'n': 1}}",
    "JSON": f'{{"api_key": "{SECRET}"}}',
    "header": f"authorization: Bearer {SECRET}",
    "traceback line": f"    psycopg.connect('host=h password={SECRET}')",
}
ALL_FORMS = {**DATABASE_FORMS, **REDIS_FORMS, **TEXT_FORMS}


@pytest.mark.parametrize("text", ALL_FORMS.values(), ids=ALL_FORMS.keys())
def test_mask_hides_every_form(text: str) -> None:
    masked = mask(text)
    assert SECRET not in masked and "****" in masked
    assert mask_url(text) == masked  # the name callers use is the same function


def test_mask_leaves_the_rest_readable() -> None:
    assert (
        mask(DATABASE_FORMS["multi-host"]) == "postgresql://herd:****@127.0.0.1:9,127.0.0.1:10/db"
    )
    assert (
        mask(DATABASE_FORMS["query password"])
        == "postgresql://127.0.0.1:9/db?user=herd&password=****"
    )
    assert mask(DATABASE_FORMS["libpq quoted"]) == "host=127.0.0.1 port=9 password='****' dbname=db"
    plain = "http://127.0.0.1:8000/jobs?limit=5 max_tokens=100 input_tokens=3; a bearer token"
    assert mask(plain) == plain


@pytest.mark.timeout(60)
def test_masking_a_megabyte_traceback_takes_linear_time() -> None:
    # Each of these took minutes at a fifth of the size when a scheme could start mid-word.
    for text in ("a" * (1 << 20), "a-" * (1 << 19), "password" * (1 << 17), "x://" * (1 << 16)):
        started = time.monotonic()
        mask(text)
        assert time.monotonic() - started < 10, text[:8]


def test_configured_secrets_are_masked_verbatim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-" + SECRET)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-" + SECRET)
    monkeypatch.setenv("HERD_API_TOKEN", "tok-" + SECRET)
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://user:pw-{SECRET}@127.0.0.1:9/v1")
    for said in ("sk-openai-", "sk-ant-", "tok-", "pw-"):
        assert SECRET not in mask(f"the provider answered: {said}{SECRET} is wrong")
    # Given in code rather than the environment: remembered when the settings are made.
    Settings(api_token="code-token-" + SECRET[::-1])
    assert SECRET[::-1] not in mask(f"echoed code-token-{SECRET[::-1]}")
    # A piece that libpq quotes after splitting an unencoded password at '@'.
    Settings(database_url="postgresql://u:first@Zq9-second-piece@127.0.0.1:9/db")
    assert "Zq9-second-piece" not in mask("failed to resolve host 'Zq9-second-piece@127.0.0.1'")


def test_settings_repr_masks_the_urls_and_the_token() -> None:
    s = Settings(
        database_url=DATABASE_FORMS["slash in password"],
        redis_url=REDIS_FORMS["query password"],
        api_token=SECRET,
    )
    assert SECRET not in repr(s) and SECRET not in str(s)
    assert "database_url='postgresql://herd:****@127.0.0.1:9/db'" in repr(s)


# -- the CLI


@pytest.mark.parametrize("url", DATABASE_FORMS.values(), ids=DATABASE_FORMS.keys())
def test_cli_error_line_masks_the_database_url(url: str) -> None:
    r = herd("jobs", "list", url=url)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("herd: error:"), r.stderr
    assert SECRET not in r.stderr + r.stdout


@pytest.mark.parametrize("url", REDIS_FORMS.values(), ids=REDIS_FORMS.keys())
def test_cli_error_line_masks_the_redis_url(url: str) -> None:
    r = herd("jobs", "list", HERD_BROKER="redis", HERD_REDIS_URL=url)
    assert r.returncode == 1, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert SECRET not in r.stderr + r.stdout


@pytest.mark.parametrize(
    ("db", "redis"),
    list(zip(DATABASE_FORMS.values(), [*REDIS_FORMS.values()] * 3, strict=False)),
    ids=list(DATABASE_FORMS),
)
def test_herd_config_masks_every_form(db: str, redis: str, tmp_path: Path) -> None:
    # Each launch costs a second and a half: the table and the flag once, JSON for all.
    every_way = db == next(iter(DATABASE_FORMS.values()))
    ways = [("config", "--json")]
    if every_way:
        ways += [("config",), ("--database-url", db, "config")]
    for args in ways:
        r = herd(
            *args,
            HERD_DATABASE_URL=db,
            HERD_REDIS_URL=redis,
            HERD_API_TOKEN="tok-" + SECRET,
            HERD_HOME=str(tmp_path),
        )
        assert r.returncode == 0, r.stderr
        assert SECRET not in r.stdout + r.stderr
        if "--json" in args:
            assert json.loads(r.stdout)["api_token"] == "****"


# -- /healthz


@pytest.mark.parametrize("url", DATABASE_FORMS.values(), ids=DATABASE_FORMS.keys())
async def test_healthz_masks_the_database_url(url: str, pg_url: str, herd_home: Path) -> None:
    # The jobs live on the real server; /healthz probes the configured URL, which fails.
    settings = Settings(home=herd_home, database_url=url)
    async with App(settings=settings, broker=PostgresBroker(pg_url)) as app, client_of(app) as c:
        r = await c.get("/healthz")
    assert r.status_code == 503
    assert r.json()["checks"]["database"].startswith("PostgreSQL at ")
    assert SECRET not in r.text


@pytest.mark.parametrize("url", REDIS_FORMS.values(), ids=REDIS_FORMS.keys())
async def test_healthz_masks_the_redis_url(url: str, pg_url: str, herd_home: Path) -> None:
    settings = Settings(home=herd_home, database_url=pg_url, redis_url=url)
    async with App(settings=settings) as app, client_of(app) as c:
        r = await c.get("/healthz")
    assert r.status_code == 503 and r.json()["checks"]["redis"].startswith("Redis at ")
    assert SECRET not in r.text


# -- logs


def test_log_records_are_masked_message_arguments_and_traceback() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        mask_logs()
        log = logging.getLogger("herd.test.masking")
        log.setLevel(logging.INFO)
        for text in ALL_FORMS.values():
            log.warning("connecting to %s", text)
            log.warning(text)
            log.info("%(where)s", {"where": text})
        try:
            raise RuntimeError(f"cannot reach {DATABASE_FORMS['at in password']}")
        except RuntimeError:
            log.exception("failed")
        log.warning("job %d took %.1f s", 7, 1.25)  # numbers keep their format
    finally:
        root.removeHandler(handler)
        for h in root.handlers:  # pytest's own: the rest of the session logs unmasked
            for f in [f for f in h.filters if isinstance(f, MaskingFilter)]:
                h.removeFilter(f)
    written = stream.getvalue()
    assert "Traceback" in written and "RuntimeError: cannot reach" in written
    assert "job 7 took 1.2 s" in written
    assert SECRET not in written


async def test_a_served_request_is_logged_masked(pg_url: str, herd_home: Path, tmp_path: Path):
    """uvicorn's own handlers (access log) mask too, in a real `herd serve`."""
    log = tmp_path / "serve.log"
    with serving(pg_url, herd_home, log) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            for text in (f"api_key={SECRET}", f"token={SECRET}&limit=1", f"password={SECRET}"):
                await client.get(f"/jobs?{text}")
    written = log.read_text()
    assert "GET /jobs?api_key=****" in written
    assert SECRET not in written


# -- dead-lettered jobs


async def test_a_dead_lettered_jobs_error_and_traceback_are_masked(
    pg_url: str, herd_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-" + SECRET)
    # A provider base URL with credentials, where nothing listens: the call fails to connect.
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://user:{SECRET}@127.0.0.1:{free_port()}/v1")
    texts = {**ALL_FORMS, "env key": f"the key sk-env-{SECRET} was refused"}
    truncate(pg_url)
    app = App(settings=Settings(home=herd_home, database_url=pg_url))

    # The payloads name a form only: what is checked is what the worker stores.
    @app.task(name="leaky", max_attempts=1)
    async def leaky(payload: dict[str, str]) -> None:
        raise RuntimeError(f"could not use {texts[payload['form']]}")

    @app.task(name="provider", max_attempts=1)
    async def call_provider(payload: dict[str, str]) -> None:
        llm = OpenAICompatible(model="m", retry=RetryPolicy(max_tries=1))
        async with llm:
            await llm.complete("s", "u")

    async with app:
        ids = [(await app.enqueue("leaky", {"form": name})).job_id for name in texts]
        ids.append((await app.enqueue("provider", {})).job_id)
        await Worker(app, concurrency=4, poll_interval=0.05, stop_when_idle=True,
                     install_signal_handlers=False).run()  # fmt: skip
        async with client_of(app) as c:
            dlq = await c.get("/dlq")
            shown = [dlq.text, (await c.get("/overview")).text]
            jobs = [(await c.get(f"/jobs/{i}")).json() for i in ids]
    assert len(dlq.json()) == len(ids)
    for j in jobs:
        assert j["status"] == "dead", j
        assert "****" in j["last_error"] and "****" in j["last_traceback"], j["last_error"]
        assert SECRET not in j["last_error"] and SECRET not in j["last_traceback"]
    assert jobs[-1]["last_error"].startswith("ProviderUnavailable: openai m: ConnectError")
    for text in shown:
        assert SECRET not in text
