"""Schemathesis against herd's own OpenAPI document, on a real `herd serve` and the
suite's PostgreSQL: every operation, a bounded number of examples (valid and not),
without a token and with one. No answer may be a 500, and every answer, 4xx
included, must be documented and match its schema."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from herd.api import create_app
from herd.config import Settings
from tests.api.conftest import TOKEN, serving

# The document the server will serve, built without opening anything: schemathesis
# makes one test per operation at collection time, before any server runs (its lazy
# from_fixture() loader does not work with this pytest).
DOCUMENT = create_app(Settings(database_url="postgresql://collection-only/none")).openapi()
schema = schemathesis.openapi.from_dict(DOCUMENT)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]

# Examples per operation and server: about 30 s for both servers on a small machine.
# HERD_FUZZ_EXAMPLES=500 HERD_FUZZ_SEED=random digs deeper, by hand.
EXAMPLES = int(os.environ.get("HERD_FUZZ_EXAMPLES", "25"))
RANDOM = os.environ.get("HERD_FUZZ_SEED") == "random"


@pytest.fixture(scope="module", params=["no token", "token"])
def api(
    request: pytest.FixtureRequest,
    pg_url: str,
    herd_home: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, dict[str, str]]]:
    """A real server's URL and the headers a client of it sends."""
    env = {"HERD_API_TOKEN": TOKEN} if request.param == "token" else {}
    headers = {"Authorization": f"Bearer {TOKEN}"} if env else {}
    log = tmp_path_factory.mktemp("fuzz") / "serve.log"
    with serving(pg_url, herd_home, log, **env) as url:
        served = httpx.get(url + "/openapi.json", headers=headers, timeout=10)
        assert served.json() == DOCUMENT, "the server serves another document than the one fuzzed"
        yield url, headers


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not RANDOM,  # the same examples every run: a failure here is reproducible
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_500_and_every_answer_is_documented(
    case: schemathesis.Case, api: tuple[str, dict[str, str]]
) -> None:
    url, headers = api
    case.call_and_validate(base_url=url, headers=headers, checks=CHECKS)


def test_the_fuzzed_operations_include_every_evaluation_route() -> None:
    # schema.parametrize() fuzzes what the document names: a route left out of it (or
    # one renamed) would silently not be fuzzed.
    operations = {(m.upper(), p) for p, item in DOCUMENT["paths"].items() for m in item}
    routes = [("GET", "/evals"), ("POST", "/evals"), ("GET", "/evals/{batch}"),
              ("GET", "/evals/{batch}/results"), ("POST", "/evals/{batch}/budget"),
              ("POST", "/evals/{batch}/resume"), ("POST", "/evals/{batch}/cancel")]  # fmt: skip
    for route in routes:
        assert route in operations, route
        # ... with every refusal it can give documented, so the fuzzer checks them: 403
        # (another caller's batch, a cross-site request) and 409 (a name taken).
        responses = DOCUMENT["paths"][route[1]][route[0].lower()]["responses"]
        assert "403" in responses, route
    assert "409" in DOCUMENT["paths"]["/evals"]["post"]["responses"]
