"""The simulator's HTTP server: OpenAI chat completions and Anthropic messages.

A ``ThreadingHTTPServer`` (stdlib, one thread per connection, HTTP/1.1 keep-alive):
no dependency, and a thread that waits out the latency can watch its socket, so a
client that hangs up before the answer is seen at once (``select`` + ``MSG_PEEK``
reading end-of-file) and counted as ``disconnected``.

Routes::

    POST /v1/chat/completions   (also /chat/completions)   OpenAI wire format
    POST /v1/messages                                        Anthropic wire format
    GET  /v1/models                                          a one-model list
    /v1/files, /v1/batches, /v1/messages/batches             the Batch APIs (``batches.py``)
    GET  /_sim/stats            counters since start or the last reset
    GET  /_sim/calls            calls that carried an ``x-sim-tag`` header, by tag
    GET  /_sim/config           the behaviour in force (the key masked)
    POST /_sim/config           change the behaviour: a partial JSON object
    POST /_sim/reset            counters, script and behaviour back to start-up

When the simulator has a key, ``POST /_sim/config`` needs it too (``Authorization:
Bearer KEY`` or ``x-api-key: KEY``), else 401: whoever may call the model must not
be able to switch its key off. ``POST /_sim/reset`` needs the start-up key
(``--api-key``), as it only goes back to what the operator started. Request bodies
are bounded: past ``MAX_BODY_BYTES`` (32 MiB, the size Anthropic's API takes) the
answer is 413 and the body is not read.

What a model call gets is decided in this order: a wrong or missing key (when the
simulator has one: its own, or one of the ``keys`` of the config) → 401; an
Anthropic call without ``anthropic-version`` → 400; ``stream: true`` → 400; a key
the config refuses (``keys``, ``spells.py``) → 401;
then the rate limits (``rpm``, ``tpm``, a key's own; ``limits.py``): a call that does
not fit is answered 429 at once; then a spell over the model (``spells``: 529/5xx for a
time, ``spells.py``), at once, not billed; then the next entry of the script if
any, else a random draw against the failure rates, else a normal answer. The latency
applies to every outcome except 429 (rate limiters answer at once) and ``hang`` (which
never answers: it waits until the client goes away, or ``hang_max`` seconds). With
limits set, every answer from the limits on carries the wire format's rate-limit
headers (OpenAI ``x-ratelimit-*``, Anthropic ``anthropic-ratelimit-*``).

Counters of ``/_sim/stats`` beyond the obvious ones: ``rate_limited`` is the number of
429s sent because a limit was full (not the scripted or drawn ones, which count under
``by_outcome``); ``billed`` is the number of calls that passed the limits and whose
draw was a generated answer (``ok``, ``malformed`` or ``schema_invalid``), counted when
generation begins, so a call whose client hung up during the latency is billed too,
as a provider bills it; ``billed_tokens`` are those calls' input and output tokens.
Calls refused (401, 400, 429) and drawn failures (5xx, ``hang``) are not billed.
Requests answered in batches are counted apart: ``batches``, ``batch_billed`` and
``batch_tokens`` (``batches.py``).
``cached_input_tokens`` and ``cache_write_tokens`` are the prompt-cache reads and writes
of billed calls (promptcache.py), ``prompt_cache_keys`` the distinct OpenAI
``prompt_cache_key`` values calls carried. ``by_key`` counts per API key (by its id,
``k`` + 10 hex digits of its sha256 as herd.limits.key_id names it, never the key) the
calls that passed the key check, the 429s its limits sent and the calls billed: a
test of a key pool reads which key paid for what.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

from herd.errors import ConfigError
from herd.testing.simulator import batches
from herd.testing.simulator.config import SimConfig
from herd.testing.simulator.exchange import MAX_BODY_BYTES, Exchange, given_key, same_key
from herd.testing.simulator.limits import Verdict, headers_for
from herd.testing.simulator.spells import error_of
from herd.testing.simulator.state import SimState
from herd.testing.simulator.wire import Request, answer_payload, generate, weight

log = logging.getLogger("herd.testing.simulator")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: SimState) -> None:
        self.state = state
        self.batches = batches.BatchStore(state)
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up mid-exchange is a normal event here, not a traceback.
        pass


class _Handler(Exchange):
    server: _Server
    server_version = "herd-simulator/0.1"
    _tagged: dict[str, Any] | None = None  # the record of the tagged call being answered
    _limit_headers: dict[str, str] = {}  # rate-limit headers of the call being answered

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.server.state.verbose:
            super().log_message(format, *args)

    # Routing ------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        state = self.server.state
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/_sim/stats":
            self.send_json(200, {**state.stats(), **self.server.batches.stats()})
        elif path == "/_sim/calls":
            self.send_json(200, state.calls_by_tag())
        elif path == "/_sim/config":
            with state.lock:
                self.send_json(200, state.config.public())
        elif path in ("/v1/models", "/models"):
            self.send_json(200, {"object": "list", "data": [{"id": "sim", "object": "model"}]})
        elif path in ("/health", "/_sim/health"):
            self.send_json(200, {"ok": True})
        elif batches.owns(path):
            self.server.batches.serve(self, "GET", self.path)
        else:
            self.send_json(404, {"error": {"message": f"no route GET {path}", "type": "not_found"}})

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0].rstrip("/")
        if batches.owns(path):  # reads its own body: batch files are larger than a call
            self.server.batches.serve(self, "POST", self.path)
            return
        body = self._read_body()
        if body is None:
            return
        state = self.server.state
        if path in ("/v1/chat/completions", "/chat/completions"):
            self._model_call("openai", body)
        elif path == "/v1/messages":
            self._model_call("anthropic", body)
        elif path == "/_sim/reset":
            if not self._control_allowed(state.initial.api_key):
                return
            state.reset()
            self.server.batches.reset()
            self.send_json(200, {"ok": True})
        elif path == "/_sim/config":
            with state.lock:
                key = state.config.api_key
            if not self._control_allowed(key):
                return
            if not isinstance(body, dict):
                self.send_json(400, {"error": {"message": "config must be a JSON object"}})
                return
            try:
                self.send_json(200, state.configure(body))
            except (ConfigError, ValueError) as exc:
                self.send_json(400, {"error": {"message": str(exc), "type": "invalid_config"}})
        else:
            self.send_json(
                404, {"error": {"message": f"no route POST {path}", "type": "not_found"}}
            )

    def do_DELETE(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0].rstrip("/")
        if batches.owns(path):
            self.server.batches.serve(self, "DELETE", self.path)
        else:
            self.send_json(
                404, {"error": {"message": f"no route DELETE {path}", "type": "not_found"}}
            )

    # Model calls --------------------------------------------------------------------

    def _model_call(self, api: str, body: Any) -> None:
        state = self.server.state
        if not isinstance(body, dict):
            body = {}
        model = str(body.get("model") or "unknown")
        generation = state.begin(api, model)
        tag = self.headers.get("x-sim-tag")
        self._tagged = state.tag_call(tag) if tag else None
        self._limit_headers = {}
        self._in_flight = True
        try:
            self._answer(api, model, body, generation)
        finally:
            self._done()
            if self._tagged is not None:
                with state.lock:
                    self._tagged["end"] = time.time()

    def _done(self) -> None:
        """The call is over for the counters (before its answer leaves: no race with readers)."""
        if getattr(self, "_in_flight", False):
            self._in_flight = False
            self.server.state.end()

    def _answer(self, api: str, model: str, body: dict[str, Any], generation: int) -> None:
        state = self.server.state
        with state.lock:
            key = state.config.api_key
            retry_after = state.config.retry_after
            hang_max = state.config.hang_max
        given = given_key(self.headers, api)
        if key is not None and not same_key(given, key) and not state.known_key(given):
            # Like the real services, the refusal names the key it got: the clients must
            # keep it out of their errors and logs.
            self._error(api, generation, 401, "authentication_error", f"Invalid API key: {given}")
            return
        if state.refused_key(given):
            self._error(api, generation, 401, "authentication_error", f"Invalid API key: {given}")
            return
        if api == "anthropic" and not self.headers.get("anthropic-version"):
            self._error(
                api, generation, 400, "invalid_request_error", "anthropic-version header missing"
            )
            return
        if body.get("stream"):
            self._error(api, generation, 400, "invalid_request_error", "stream is not simulated")
            return
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            self._error(api, generation, 400, "invalid_request_error", "messages is required")
            return
        try:
            req = Request.of(api, body)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            message = f"the simulator cannot read this request: {type(exc).__name__}: {exc}"
            self._error(api, generation, 400, "invalid_request_error", message)
            return

        verdict = state.admit(generation, given, model, weight(req, body))
        if verdict is not None:
            with state.lock:
                send_after = state.config.limit_retry_after
            self._limit_headers = headers_for(api, verdict, retry_after=send_after)
            if not verdict.admitted:
                self._refuse(api, generation, model, verdict)
                return

        spell = state.spell(generation, model)
        if spell is not None:
            # An overloaded model answers at once, in its provider's words (spells.py).
            self._error(api, generation, spell, *error_of(api, spell))
            return
        outcome, latency = state.draw(generation)
        name, _, arg = outcome.partition(":")
        if name == "rate_limit":
            after = float(arg) if arg else retry_after
            self._error(
                api,
                generation,
                429,
                "rate_limit_error",
                "Rate limit reached (simulated).",
                {"retry-after": f"{after:g}"},
            )
            return
        text = ""
        tokens = (0, 0)
        cache = (0, 0)  # prompt-cache tokens read, written
        if name in ("ok", "malformed", "schema_invalid"):
            # Generation begins: billed from here even if the client hangs up before the end.
            text, tokens = generate(state, req, name)
            state.bill(generation, tokens, given)
            cache = state.cache_prompt(generation, api, given, model, body)
        if name == "hang":
            if self._client_gone(hang_max):
                state.hung_up(generation)
            self.close_connection = True
            return
        if self._client_gone(latency):
            state.hung_up(generation)
            self.close_connection = True
            return
        if name == "server_error":
            self._error(api, generation, 500, "api_error", "Internal server error (simulated).")
            return
        if name.isdigit():
            status = int(name)
            headers = {}
            if arg or status in (429, 503, 529):
                headers["retry-after"] = f"{float(arg) if arg else retry_after:g}"
            self._error(api, generation, status, "api_error", f"Simulated {status}.", headers)
            return

        self._send(
            generation, 200, answer_payload(api, model, req, text, tokens, cache), tokens=tokens
        )

    def _refuse(self, api: str, generation: int, model: str, verdict: Verdict) -> None:
        """429 for a limit, in the provider's error JSON, so its SDK raises RateLimitError."""
        scope = verdict.scope or "requests"
        dim = next((d for d in verdict.dimensions if d.name == scope), None)
        limit = dim.limit if dim is not None else 0
        asked = 1 if scope == "requests" else verdict.requested
        wait = verdict.retry_after or 0.0
        per = "RPM" if scope == "requests" else "TPM"
        message = (
            f"Rate limit reached for {model} on {scope} per min ({per}): Limit {limit},"
            f" Requested {asked}. Please try again in {wait:.3f}s."
        )
        if asked > limit:
            message = (
                f"Request too large for {model} on {scope} per min ({per}):"
                f" Limit {limit}, Requested {asked}."
            )
        if api == "anthropic":
            self._error(api, generation, 429, "rate_limit_error", message)
        else:
            self._error(api, generation, 429, scope, message, code="rate_limit_exceeded")

    # Plumbing -----------------------------------------------------------------------

    def _client_gone(self, seconds: float) -> bool:
        """Wait ``seconds``; True as soon as the client closes its end of the connection."""
        deadline = time.monotonic() + seconds
        sock = self.connection
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                readable, _, _ = select.select([sock], [], [], remaining)
                if not readable:
                    return False
                if not sock.recv(1, socket.MSG_PEEK):
                    return True  # end of file: the client hung up
            except (OSError, ValueError):
                return True
            # Bytes of a next (pipelined) request: nothing more to learn, wait it out.
            time.sleep(max(0.0, deadline - time.monotonic()))
            return False

    def _control_allowed(self, key: str | None) -> bool:
        """True if the call may change the simulator; else it is answered 401."""
        bearer = (self.headers.get("authorization") or "").removeprefix("Bearer ").strip()
        if key is None or same_key(bearer, key) or same_key(self.headers.get("x-api-key"), key):
            return True
        message = "the simulator's control routes need its API key (Authorization: Bearer KEY)"
        self.send_json(401, {"error": {"message": message, "type": "authentication_error"}})
        return False

    def _read_body(self) -> Any:
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.send_json(400, {"error": {"message": "bad Content-Length"}})
            return None
        if length > MAX_BODY_BYTES:
            # Not read: the connection closes instead, so its bytes cost nothing.
            self.close_connection = True
            message = f"request body of {length} bytes is over the limit of {MAX_BODY_BYTES}"
            self.send_json(
                413,
                {"error": {"message": message, "type": "request_too_large"}},
                {"connection": "close"},
            )
            return None
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            self.send_json(400, {"error": {"message": "body is not JSON", "type": "invalid_json"}})
            return None

    def _error(
        self,
        api: str,
        generation: int,
        status: int,
        kind: str,
        message: str,
        headers: dict[str, str] | None = None,
        code: str | None = None,
    ) -> None:
        if api == "anthropic":
            payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
        else:
            payload = {"error": {"message": message, "type": kind, "param": None, "code": code}}
        self._send(generation, status, payload, headers)

    def _send(
        self,
        generation: int,
        status: int,
        payload: Any,
        headers: dict[str, str] | None = None,
        tokens: tuple[int, int] = (0, 0),
    ) -> None:
        """Answer a model call; counted before the bytes leave, so a client that reads the
        stats right after its answer sees it counted."""
        state = self.server.state
        state.answered(generation, status, tokens)
        self._done()
        if self._limit_headers:
            headers = {**self._limit_headers, **(headers or {})}
        if not self.send_json(status, payload, headers):
            state.answered(generation, status, tokens, sign=-1)
            state.hung_up(generation)
        elif self._tagged is not None:
            with state.lock:
                self._tagged["status"] = status


class Simulator:
    """The simulator in this process, on a thread: ``start()``, ``url``, ``close()``."""

    def __init__(
        self,
        config: SimConfig | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        verbose: bool = False,
    ) -> None:
        self.state = SimState(config or SimConfig(), verbose)
        self._server = _Server((host, port), self.state)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        self._server.serve_forever(poll_interval=0.2)

    def start(self) -> Simulator:
        self._thread = threading.Thread(target=self.serve_forever, name="herd-sim", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()
