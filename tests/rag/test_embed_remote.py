"""The OpenAI-compatible embeddings client, against a real HTTP server on loopback."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from herd.rag.embedders.remote import (
    RemoteEmbedder,
    RemoteEmbedError,
    key_for,
    parse_retry_after,
)
from herd.rag.embedders.spec import build

KEY = "sk-test-0123456789abcdef-do-not-leak"
OPENAI_KEY = "sk-openai-0123456789abcdef-do-not-leak"
DIM = 8


def vector(text: str) -> list[float]:
    """What the server sends for a text: deterministic, not normalized."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    return [float(x) for x in np.random.default_rng(seed).normal(size=DIM) * 3.0]


@dataclass
class Server:
    url: str
    failures: list[tuple[int, dict[str, str], str]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)


@pytest.fixture(autouse=True)
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's keys and servers never reach these tests."""
    for name in ("HERD_EMBEDDER_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Iterator[Server]:
    state = Server(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.times.append(time.monotonic())
            state.requests.append(
                {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
            )
            if state.failures:
                status, headers, text = state.failures.pop(0)
                self._send(status, text.encode(), headers)
                return
            texts = body["input"]
            data = [
                {"object": "embedding", "index": i, "embedding": vector(t)}
                for i, t in enumerate(texts)
            ]
            answer = {"object": "list", "model": body["model"], "data": data[::-1]}
            self._send(200, json.dumps(answer).encode(), {"Content-Type": "application/json"})

        def _send(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield state
    httpd.shutdown()
    httpd.server_close()


def make(server: Server, **kw: Any) -> RemoteEmbedder:
    options: dict[str, Any] = {"base_url": server.url, "dim": DIM, "initial_delay": 0.01} | kw
    return RemoteEmbedder("test-embed", **options)


def expected(texts: list[str]) -> np.ndarray:
    v = np.array([vector(t) for t in texts], dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_batches_keep_order_and_are_normalized(server: Server) -> None:
    texts = [f"verse {i}" for i in range(10)]
    with make(server, batch_size=4) as embedder:
        vectors = embedder.embed(texts)
    assert vectors.shape == (10, DIM) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, expected(texts), atol=1e-6)
    assert [len(r["body"]["input"]) for r in server.requests] == [4, 4, 2]
    assert {r["path"] for r in server.requests} == {"/v1/embeddings"}
    assert server.requests[0]["body"]["model"] == "test-embed"
    assert server.requests[0]["body"]["encoding_format"] == "float"


def test_empty_input_sends_nothing(server: Server) -> None:
    assert make(server).embed([]).shape == (0, DIM)
    assert server.requests == []


def test_dim_is_asked_of_the_server_when_not_given(server: Server) -> None:
    embedder = make(server, dim=None)
    assert embedder.dim == DIM and len(server.requests) == 1


def test_a_429_is_retried_after_retry_after(
    server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HERD_EMBEDDER_API_KEY", KEY)
    server.failures.append((429, {"Retry-After": "1"}, '{"error": "slow down"}'))
    embedder = make(server)
    with caplog.at_level(logging.DEBUG):
        vectors = embedder.embed(["Jesus wept."])
    np.testing.assert_allclose(vectors, expected(["Jesus wept."]), atol=1e-6)
    assert len(server.requests) == 2
    assert server.times[1] - server.times[0] >= 1.0  # Retry-After waited out
    assert "429" in caplog.text and KEY not in caplog.text
    assert all(r["auth"] == f"Bearer {KEY}" for r in server.requests)


def test_server_errors_are_retried_with_backoff(server: Server) -> None:
    server.failures += [(503, {}, "busy"), (500, {}, "oops")]
    vectors = make(server).embed(["a", "b"])
    assert vectors.shape == (2, DIM) and len(server.requests) == 3


def test_it_gives_up_after_max_tries(server: Server) -> None:
    server.failures += [(502, {}, "bad gateway")] * 3
    with pytest.raises(RemoteEmbedError, match="gave up after 3 tries") as info:
        make(server, max_tries=3).embed(["a"])
    assert info.value.status == 502 and len(server.requests) == 3


def test_a_long_retry_after_is_not_waited_out(server: Server) -> None:
    server.failures.append((429, {"Retry-After": "3600"}, "quota"))
    with pytest.raises(RemoteEmbedError) as info:
        make(server).embed(["a"])
    assert info.value.retry_after == 3600 and len(server.requests) == 1


def test_the_key_never_appears_in_errors_ids_or_reprs(
    server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HERD_EMBEDDER_API_KEY", KEY)
    server.failures.append((401, {}, f'{{"error": "bad key Bearer {KEY}"}}'))  # an echoing server
    embedder = make(server)
    with caplog.at_level(logging.DEBUG), pytest.raises(RemoteEmbedError) as info:
        embedder.embed(["a"])
    assert info.value.status == 401 and len(server.requests) == 1  # 401 is not retried
    assert KEY not in str(info.value) and "[REDACTED]" in str(info.value)
    assert KEY not in embedder.id and KEY not in repr(embedder) and KEY not in caplog.text
    assert server.requests[0]["auth"] == f"Bearer {KEY}"


def test_no_key_sends_no_authorization(server: Server) -> None:
    make(server).embed(["a"])
    assert server.requests[0]["auth"] is None


def test_the_openai_key_is_not_sent_to_a_server_a_spec_names(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A remote: spec is stored with its collection: whoever writes one chose the URL.
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    build(f"remote:{server.url}?model=test-embed").embed(["a"])
    make(server).embed(["b"])
    assert [r["auth"] for r in server.requests] == [None, None, None]  # the first asks the dim
    monkeypatch.setenv("HERD_EMBEDDER_API_KEY", KEY)  # a key of its own goes where it is told
    make(server).embed(["c"])
    assert server.requests[-1]["auth"] == f"Bearer {KEY}"


def test_the_openai_key_goes_only_where_the_openai_provider_sends_it(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    assert key_for("https://api.openai.com/v1") == OPENAI_KEY
    assert key_for("https://API.OpenAI.com:443/v1/") == OPENAI_KEY
    for elsewhere in (
        "http://api.openai.com/v1",  # plain HTTP: anyone on the path reads it
        "https://api.openai.com:8443/v1",
        "https://api.openai.com.evil.example/v1",
        "https://evil.example/v1?host=api.openai.com",
        "https://api.openai.com:x/v1",
        server.url,
    ):
        assert key_for(elsewhere) is None, elsewhere
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)  # the LLM provider's server already has it
    assert key_for(server.url.replace("/v1", "/other")) == OPENAI_KEY
    make(server).embed(["a"])
    assert server.requests[-1]["auth"] == f"Bearer {OPENAI_KEY}"
    monkeypatch.setenv("HERD_EMBEDDER_API_KEY", KEY)
    assert key_for("https://api.openai.com/v1") == KEY


def test_an_unreachable_server_is_retried_then_reported(caplog: pytest.LogCaptureFixture) -> None:
    embedder = RemoteEmbedder(
        "m", base_url="http://127.0.0.1:9/v1", dim=4, max_tries=2, initial_delay=0.01, timeout=2.0
    )
    with pytest.raises(RemoteEmbedError, match="could not be reached"):
        embedder.embed(["a"])


def test_a_malformed_answer_is_an_error(server: Server) -> None:
    server.failures.append((200, {"Content-Type": "application/json"}, '{"data": "nope"}'))
    with pytest.raises(RemoteEmbedError, match="no embeddings list"):
        make(server).embed(["a"])


def test_the_id_names_model_server_and_options(server: Server) -> None:
    a = make(server)
    assert a.id.startswith("remote:test-embed;") and "server=http://127.0.0.1:" in a.id
    assert make(server, prefix="query: ").id != a.id
    assert make(server, normalize=False).id != a.id
    assert make(server, name="test-embed@v2").id != a.id
    creds = RemoteEmbedder("m", base_url="http://user:pw@127.0.0.1:9/v1?key=abc", dim=4)
    assert "pw" not in creds.id and "abc" not in creds.id


async def test_aembed_matches_embed(server: Server) -> None:
    server.failures.append((429, {"retry-after-ms": "50"}, "later"))
    texts = [f"ayat {i}" for i in range(5)]
    embedder = make(server, batch_size=2)
    vectors = await embedder.aembed(texts)
    np.testing.assert_allclose(vectors, embedder.embed(texts), atol=1e-7)
    np.testing.assert_allclose(vectors, expected(texts), atol=1e-6)


def test_parse_retry_after() -> None:
    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    assert parse_retry_after({"Retry-After": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "Tue, 01 Dec 2026 12:00:30 GMT"}, now) == 30.0
    assert parse_retry_after({"retry-after-ms": "250", "Retry-After": "9"}) == 0.25
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({}) is None
