"""The providers' Batch APIs: OpenAI's Files + Batches and Anthropic's Message Batches.

Routes (in each provider's documented wire format, so the official SDKs parse them)::

    POST   /v1/files                      multipart upload (purpose "batch"), a File object
    GET    /v1/files                      list: purpose, after, limit, order (newest first)
    GET    /v1/files/{id}                 a File object
    GET    /v1/files/{id}/content         the file's bytes (JSONL)
    DELETE /v1/files/{id}
    POST   /v1/batches                    {input_file_id, endpoint, completion_window, metadata}
    GET    /v1/batches                    list: after, limit (newest first)
    GET    /v1/batches/{id}
    POST   /v1/batches/{id}/cancel
    POST   /v1/messages/batches           {requests: [{custom_id, params}]}
    GET    /v1/messages/batches           list: after_id, before_id, limit (newest first)
    GET    /v1/messages/batches/{id}
    GET    /v1/messages/batches/{id}/results   JSONL, once the batch has ended
    POST   /v1/messages/batches/{id}/cancel
    DELETE /v1/messages/batches/{id}      an ended batch only

Time: a batch created with ``batch_latency`` L (``--batch-latency``, ``/_sim/config``;
taken when the batch is created, as is ``batch_expire``) answers its requests one after
another over its first 0.9 L and ends at L. OpenAI's batch reads ``validating`` in the
create answer, then ``in_progress``, ``finalizing`` for the last 0.1 L, then
``completed`` (or ``failed`` when a line's url or model does not fit the batch). A
cancel turns it ``cancelling`` and, L/2 later, ``cancelled``; the requests answered by
then keep their lines. With ``batch_expire`` a batch answers nothing and ends
``expired`` at L, every request in the error file with code ``batch_expired``.
Anthropic's batch is ``in_progress``, ``canceling`` after a cancel, then ``ended``; as
documented, its request_counts stay all ``processing`` until it ends.

Each request is answered by the synchronous routes' engine (``wire.generate`` and
``wire.answer_payload``): the same body gets the same answer and usage. A request
draws its outcome from the ``fail_rates`` (the script is for synchronous calls only): a
generated outcome (ok, malformed, schema_invalid) succeeds and is billed; 429, 5xx or a
hang make the line errored (OpenAI: in the error file with its status code; Anthropic:
``errored`` with the error body). Nothing here counts in the synchronous ``billed``:
``/_sim/stats`` gains ``batches`` ({created, created_by_api, by_status}),
``batch_billed`` (requests answered in batches) and ``batch_tokens``.

``batch_result_faults`` (``/_sim/config``, taken when a batch is created) makes its
results carry faults a client must survive (``faulty``): an extra line with
custom_id ``""`` (empty_id), the last answer under its id cut in half (unknown_id),
the first line twice (duplicate), a line that is not JSON (not_json), the first line's
``response`` (Anthropic: ``result``) a string (not_object). OpenAI's go in the output
file (the error file when nothing succeeded).

Work is done lazily: whatever reads a batch or the stats first advances every batch to
the present, so no thread runs. State is bounded: at most ``MAX_BATCHES`` batches and
``MAX_FILES`` files (``MAX_STORED_BYTES`` in all); past that the oldest ended batches and
the oldest files no running batch reads are dropped. ``/_sim/reset`` clears everything.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any
from urllib.parse import parse_qs, urlsplit

from herd.limits.base import key_id as herd_key_id
from herd.testing.simulator.exchange import MAX_BODY_BYTES, Exchange, given_key, same_key
from herd.testing.simulator.state import SimState
from herd.testing.simulator.wire import Request, answer_payload, generate

MAX_BATCHES = 1_000
MAX_FILES = 1_000
MAX_STORED_BYTES = 1024 * 1024 * 1024
OPENAI_MAX_FILE_BYTES = 200 * 1024 * 1024
OPENAI_MAX_REQUESTS = 50_000
OPENAI_ENDPOINTS = ("/v1/chat/completions",)
ANTHROPIC_MAX_BYTES = 256 * 1024 * 1024
ANTHROPIC_MAX_REQUESTS = 100_000
METADATA_MAX_PAIRS, METADATA_KEY_MAX, METADATA_VALUE_MAX = 16, 64, 512
WINDOW = 24 * 3600  # both providers expire a batch 24 hours after its creation
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # Anthropic's documented pattern
GENERATED = ("ok", "malformed", "schema_invalid")
OPENAI_ENDED = ("completed", "failed", "expired", "cancelled")


def owns(path: str) -> bool:
    """True for the routes this module answers (the server dispatches them here)."""
    return path.startswith(("/v1/files", "/v1/batches", "/v1/messages/batches"))


class BadRequest(Exception):
    """A request this API refuses: HTTP ``status`` with the provider's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind or ("not_found_error" if status == 404 else "invalid_request_error")


@dataclass
class _File:
    id: str
    filename: str
    purpose: str
    data: bytes
    created: float
    owner: str = ""  # the id of the key that made it: another key cannot see it

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": int(self.created),
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": None,
        }


@dataclass
class _Batch:
    api: str
    id: str
    created: float
    latency: float
    expire: bool
    requests: list[tuple[str, Any]]  # (custom_id, body) in the order given
    endpoint: str = ""
    input_file_id: str = ""
    window: str = "24h"
    metadata: dict[str, str] | None = None
    model: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)  # OpenAI validation errors
    results: list[dict[str, Any] | None] = field(default_factory=list)  # per request, once done
    done: int = 0  # requests answered so far (in order)
    cancel_at: float | None = None
    ended_at: float | None = None
    ended_as: str = ""  # completed, failed, cancelled, expired (Anthropic: ended)
    output_file_id: str | None = None
    error_file_id: str | None = None
    tokens: list[int] = field(default_factory=lambda: [0, 0])
    faults: tuple[str, ...] = ()  # batch_result_faults when it was created
    # The id of the key that made it: as the providers keep a batch in the project or
    # workspace of its key, another key neither lists nor reaches it.
    owner: str = ""

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    def due(self, index: int) -> float:
        """When request ``index`` is answered: spread over the first 0.9 of the latency."""
        return self.created + 0.9 * self.latency * (index + 1) / max(1, len(self.requests))


class BatchStore:
    """Files and batches of both APIs, under their own lock (taken before the state's)."""

    def __init__(self, state: SimState) -> None:
        self.state = state
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.files: OrderedDict[str, _File] = OrderedDict()
            self.batches: OrderedDict[str, _Batch] = OrderedDict()
            self.created: dict[str, int] = {"openai": 0, "anthropic": 0}
            self.created_by_key: dict[str, int] = {}
            self.billed = 0
            self.billed_tokens = [0, 0]
            self.cache_tokens = [0, 0]  # of batch_tokens' input: read from, written to the cache

    def stats(self) -> dict[str, Any]:
        with self.lock:
            self._advance(time.time())
            by_status: dict[str, dict[str, int]] = {"openai": {}, "anthropic": {}}
            for b in self.batches.values():
                status = _openai_status(b, time.time()) if b.api == "openai" else _anth_status(b)
                by_status[b.api][status] = by_status[b.api].get(status, 0) + 1
            return {
                "batches": {
                    "created": sum(self.created.values()),
                    "created_by_api": dict(self.created),
                    "created_by_key": dict(self.created_by_key),
                    "by_status": by_status,
                },
                "batch_billed": self.billed,
                "batch_tokens": {
                    "input": self.billed_tokens[0],
                    "output": self.billed_tokens[1],
                    "total": sum(self.billed_tokens),
                    "cached_input": self.cache_tokens[0],
                    "cache_write": self.cache_tokens[1],
                },
            }

    # Processing ---------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        for batch in self.batches.values():
            if not batch.ended:
                self._step(batch, now)

    def _step(self, b: _Batch, now: float) -> None:
        if b.api == "openai" and b.errors:
            self._end(b, "failed", b.created)
            return
        if b.expire:
            if now >= b.created + b.latency:
                self._end(b, "expired", b.created + b.latency)
            return
        stop = now if b.cancel_at is None else min(now, b.cancel_at)
        while b.done < len(b.requests) and b.due(b.done) <= stop:
            custom_id, body = b.requests[b.done]
            b.results.append(self._answer(b, custom_id, body))
            b.done += 1
        if b.cancel_at is not None:
            if now >= b.cancel_at + b.latency / 2:
                self._end(b, "cancelled" if b.api == "openai" else "ended", now)
        elif now >= b.created + b.latency:
            self._end(b, "completed" if b.api == "openai" else "ended", b.created + b.latency)

    def _answer(self, b: _Batch, custom_id: str, body: Any) -> dict[str, Any]:
        """One request's result: ``{"status": HTTP status, "body": answer or error body}``."""
        api = b.api
        if not isinstance(body, dict):
            return _failure(api, 400, "invalid_request_error", "body must be a JSON object")
        if body.get("stream"):
            return _failure(api, 400, "invalid_request_error", "stream is not supported in batches")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return _failure(api, 400, "invalid_request_error", "messages is required")
        if api == "anthropic" and not isinstance(body.get("max_tokens"), int):
            return _failure(api, 400, "invalid_request_error", "max_tokens: Field required")
        try:
            req = Request.of(api, body)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            message = f"the simulator cannot read this request: {type(exc).__name__}: {exc}"
            return _failure(api, 400, "invalid_request_error", message)
        outcome = self._draw()
        name = outcome.partition(":")[0]
        if name in GENERATED:
            text, tokens = generate(self.state, req, name)
            model = str(body.get("model") or "unknown")
            self.billed += 1
            for i in (0, 1):
                self.billed_tokens[i] += tokens[i]
                b.tokens[i] += tokens[i]
            # Batch requests read and write the prompt cache as synchronous calls do (both
            # providers apply its discount on top of the batch price); keyless here, as
            # the batch does not keep the key it was created with.
            cache = self.state.cache_prompt(self.state.generation, api, None, model, body)
            self.cache_tokens[0] += cache[0]
            self.cache_tokens[1] += cache[1]
            payload = answer_payload(api, model, req, text, tokens, cache)
            return {"status": 200, "body": payload}
        if name == "rate_limit":
            return _failure(api, 429, "rate_limit_error", "Rate limit reached (simulated).")
        if name.isdigit():
            return _failure(api, int(name), "api_error", f"Simulated {name}.")
        return _failure(api, 500, "api_error", "Internal server error (simulated).")

    def _draw(self) -> str:
        state = self.state
        with state.lock:
            r, acc = state.rng.random(), 0.0
            for name, p in state.config.fail_rates.items():
                acc += p
                if r < acc:
                    return name
        return "ok"

    def _end(self, b: _Batch, status: str, at: float) -> None:
        b.ended_at, b.ended_as = at, status
        if b.api != "openai" or status == "failed":
            return
        out: list[dict[str, Any]] = []
        err: list[dict[str, Any]] = []
        for (custom_id, _), result in zip(b.requests, b.results, strict=False):
            assert result is not None
            line = {
                "id": f"batch_req_{uuid.uuid4().hex}",
                "custom_id": custom_id,
                "response": {
                    "status_code": result["status"],
                    "request_id": f"req_{uuid.uuid4().hex}",
                    "body": result["body"],
                },
                "error": None,
            }
            (out if result["status"] == 200 else err).append(line)
        if status == "expired":
            for custom_id, _ in b.requests[b.done :]:
                message = "This request could not be executed before the completion window expired."
                err.append(
                    {
                        "id": f"batch_req_{uuid.uuid4().hex}",
                        "custom_id": custom_id,
                        "response": None,
                        "error": {"code": "batch_expired", "message": message},
                    }
                )
        if out:
            data = faulty("openai", out, b.faults)
            out_file = self._add_file(f"{b.id}_output.jsonl", "batch_output", data, b.owner)
            b.output_file_id = out_file.id
        if err:
            data = faulty("openai", err, () if out else b.faults)
            err_file = self._add_file(f"{b.id}_error.jsonl", "batch_output", data, b.owner)
            b.error_file_id = err_file.id

    # Storage ------------------------------------------------------------------------

    def _add_file(self, filename: str, purpose: str, content: Any, owner: str) -> _File:
        data = content if isinstance(content, bytes) else _jsonl(content)
        f = _File(f"file-{uuid.uuid4().hex[:24]}", filename, purpose, data, time.time(), owner)
        self.files[f.id] = f
        reading = {b.input_file_id for b in self.batches.values() if not b.ended}
        stored = sum(len(x.data) for x in self.files.values())
        for old in list(self.files.values()):
            if len(self.files) <= MAX_FILES and stored <= MAX_STORED_BYTES:
                break
            if old.id not in reading and old.id != f.id:
                del self.files[old.id]
                stored -= len(old.data)
        return f

    def _add_batch(self, b: _Batch) -> None:
        ended = [x.id for x in self.batches.values() if x.ended]
        if len(self.batches) >= MAX_BATCHES and not ended:
            raise BadRequest(
                429, f"over {MAX_BATCHES} batches in progress", kind="rate_limit_error"
            )
        while len(self.batches) >= MAX_BATCHES:
            del self.batches[ended.pop(0)]
        self.batches[b.id] = b
        self.created[b.api] += 1
        self.created_by_key[b.owner] = self.created_by_key.get(b.owner, 0) + 1

    def _batch(self, api: str, batch_id: str, owner: str) -> _Batch:
        b = self.batches.get(batch_id)
        if b is None or b.api != api or b.owner != owner:
            what = "Batch" if api == "openai" else "message batch"
            raise BadRequest(404, f"No such {what}: {batch_id}", "batch_id")
        return b

    def _file(self, file_id: str, owner: str) -> _File:
        f = self.files.get(file_id)
        if f is None or f.owner != owner:
            raise BadRequest(404, f"No such File object: {file_id}", "id")
        return f

    # HTTP ---------------------------------------------------------------------------

    def serve(self, handler: Exchange, method: str, target: str) -> None:
        """Answer one request of these routes on ``handler``'s connection."""
        parts = urlsplit(target)
        path = parts.path.rstrip("/")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        api = "anthropic" if path.startswith("/v1/messages/batches") else "openai"
        if not self._allowed(handler, api):
            return
        owner = herd_key_id(given_key(handler.headers, api))
        try:
            if api == "openai":
                self._openai(handler, method, path, query, owner)
            else:
                self._anthropic(handler, method, path, query, owner)
        except BadRequest as exc:
            if api == "anthropic":
                body: dict[str, Any] = {
                    "type": "error",
                    "error": {"type": exc.kind, "message": str(exc)},
                }
            else:
                body = {
                    "error": {
                        "message": str(exc),
                        "type": exc.kind,
                        "param": exc.param,
                        "code": None,
                    }
                }
            handler.send_json(exc.status, body)

    def _allowed(self, handler: Exchange, api: str) -> bool:
        state = self.state
        with state.lock:
            key = state.config.api_key
        given = given_key(handler.headers, api)
        message = ""
        if key is not None and not same_key(given, key) and not state.known_key(given):
            status, kind, message = 401, "authentication_error", "Invalid API key"
        elif api == "anthropic" and not handler.headers.get("anthropic-version"):
            status, kind, message = 400, "invalid_request_error", "anthropic-version header missing"
        if not message:
            return True
        handler.close_connection = True  # the body, if any, is left unread
        if api == "anthropic":
            handler.send_json(
                status, {"type": "error", "error": {"type": kind, "message": message}}
            )
        else:
            handler.send_json(
                status, {"error": {"message": message, "type": kind, "param": None, "code": None}}
            )
        return False

    def _openai(
        self, h: Exchange, method: str, path: str, query: dict[str, str], owner: str
    ) -> None:
        seg = path.split("/")[2:]  # ["files", id, "content"] or ["batches", id, "cancel"]
        route = (method, seg[0], len(seg))
        if route == ("POST", "files", 1):
            body = _read(h, OPENAI_MAX_FILE_BYTES + 1024 * 1024, "file")
            filename, purpose, data = _multipart(h.headers.get("content-type") or "", body)
            if purpose == "batch":
                _check_openai_lines(data)
            with self.lock:
                h.send_json(200, self._add_file(filename, purpose, data, owner).public())
            return
        fields: dict[str, Any] = {}
        if method == "POST":
            fields = _json_body(_read(h, MAX_BODY_BYTES, "body"))
        with self.lock:
            now = time.time()
            self._advance(now)
            if route == ("GET", "files", 1):
                files = [
                    f
                    for f in self.files.values()
                    if query.get("purpose") in (None, f.purpose) and f.owner == owner
                ]
                if query.get("order", "desc") == "desc":
                    files.reverse()
                limit = _limit(query, 10_000, 10_000)
                h.send_json(
                    200, _openai_page([f.public() for f in files], query.get("after"), limit)
                )
            elif route == ("GET", "files", 2):
                h.send_json(200, self._file(seg[1], owner).public())
            elif route == ("DELETE", "files", 2):
                self._file(seg[1], owner)
                del self.files[seg[1]]
                h.send_json(200, {"id": seg[1], "object": "file", "deleted": True})
            elif route == ("GET", "files", 3) and seg[2] == "content":
                _send_bytes(h, self._file(seg[1], owner).data, "application/octet-stream")
            elif route == ("POST", "batches", 1):
                b = self._create_openai(fields, now, owner)
                h.send_json(200, _openai_public(b, now))
            elif route == ("GET", "batches", 1):
                limit = _limit(query, 20, 100)
                mine = [
                    b
                    for b in reversed(self.batches.values())
                    if b.api == "openai" and b.owner == owner
                ]
                batches = [_openai_public(b, now) for b in mine]
                h.send_json(200, _openai_page(batches, query.get("after"), limit))
            elif route == ("GET", "batches", 2):
                h.send_json(200, _openai_public(self._batch("openai", seg[1], owner), now))
            elif route == ("POST", "batches", 3) and seg[2] == "cancel":
                b = self._batch("openai", seg[1], owner)
                if b.ended or b.cancel_at is not None:
                    status = _openai_status(b, now)
                    raise BadRequest(409, f"Cannot cancel a batch with status '{status}'.")
                b.cancel_at = now
                h.send_json(200, _openai_public(b, now))
            else:
                raise BadRequest(404, f"no route {method} {path}", kind="invalid_request_error")

    def _create_openai(self, body: dict[str, Any], now: float, owner: str) -> _Batch:
        endpoint = body.get("endpoint")
        if endpoint not in OPENAI_ENDPOINTS:
            raise BadRequest(
                400, f"endpoint must be one of {', '.join(OPENAI_ENDPOINTS)}", "endpoint"
            )
        if body.get("completion_window") != "24h":
            raise BadRequest(400, "completion_window must be '24h'", "completion_window")
        metadata = _metadata(body.get("metadata"))
        if not isinstance(body.get("input_file_id"), str):
            raise BadRequest(400, "input_file_id is required", "input_file_id")
        source = self._file(body["input_file_id"], owner)
        if source.purpose != "batch":
            raise BadRequest(
                400, "input_file_id must be a file of purpose 'batch'", "input_file_id"
            )
        lines = [json.loads(x) for x in source.data.splitlines() if x.strip()]
        errors = []
        models = {line["body"].get("model") for line in lines}
        for n, line in enumerate(lines, 1):
            if line["url"] != endpoint:
                message = f"The URL of this request does not match the batch endpoint {endpoint}."
                errors.append({"code": "mismatched_endpoint", "line": n, "message": message})
        if len(models) > 1:
            message = "Requests in a batch must all use the same model."
            errors.append({"code": "mismatched_model", "line": None, "message": message})
        with self.state.lock:
            latency, expire = self.state.config.batch_latency, self.state.config.batch_expire
            faults = tuple(self.state.config.batch_result_faults)
        b = _Batch(
            api="openai",
            id=f"batch_{uuid.uuid4().hex[:24]}",
            created=now,
            latency=latency,
            expire=expire,
            requests=[(line["custom_id"], line["body"]) for line in lines],
            endpoint=str(endpoint),
            input_file_id=source.id,
            metadata=metadata,
            model=str(next(iter(models))) if len(models) == 1 else None,
            errors=[{**e, "param": None} for e in errors],
            faults=faults,
            owner=owner,
        )
        self._add_batch(b)
        return b

    def _anthropic(
        self, h: Exchange, method: str, path: str, query: dict[str, str], owner: str
    ) -> None:
        seg = path.split("/")[4:]  # [] or [id] or [id, "results" | "cancel"]
        route = (method, len(seg))
        if route == ("POST", 0):
            body = _json_body(_read(h, ANTHROPIC_MAX_BYTES, "body"))
            requests = _anthropic_requests(body)
        elif method == "POST":
            _read(h, MAX_BODY_BYTES, "body")
        base = f"http://{h.headers.get('host') or '127.0.0.1'}"
        with self.lock:
            now = time.time()
            self._advance(now)
            if route == ("POST", 0):
                with self.state.lock:
                    latency, expire = (
                        self.state.config.batch_latency,
                        self.state.config.batch_expire,
                    )
                    faults = tuple(self.state.config.batch_result_faults)
                b = _Batch(
                    "anthropic", f"msgbatch_{uuid.uuid4().hex[:24]}", now, latency, expire, requests
                )
                b.faults, b.owner = faults, owner
                self._add_batch(b)
                h.send_json(200, _anth_public(b, base))
            elif route == ("GET", 0):
                items = [
                    _anth_public(b, base)
                    for b in reversed(self.batches.values())
                    if b.api == "anthropic" and b.owner == owner
                ]
                h.send_json(200, _anth_page(items, query, _limit(query, 20, 1000)))
            elif route == ("GET", 1):
                h.send_json(200, _anth_public(self._batch("anthropic", seg[0], owner), base))
            elif route == ("DELETE", 1):
                b = self._batch("anthropic", seg[0], owner)
                if not b.ended:
                    raise BadRequest(400, f"Batch {b.id} cannot be deleted while it is processing.")
                del self.batches[b.id]
                h.send_json(200, {"id": b.id, "type": "message_batch_deleted"})
            elif route == ("GET", 2) and seg[1] == "results":
                b = self._batch("anthropic", seg[0], owner)
                if not b.ended:
                    raise BadRequest(404, f"Batch {b.id} has no results until it has ended.")
                _send_bytes(
                    h, faulty("anthropic", _anth_results(b), b.faults), "application/x-jsonl"
                )
            elif route == ("POST", 2) and seg[1] == "cancel":
                b = self._batch("anthropic", seg[0], owner)
                if b.ended or b.cancel_at is not None:
                    raise BadRequest(
                        409, f"Batch {b.id} is {_anth_status(b)}: it cannot be canceled."
                    )
                b.cancel_at = now
                h.send_json(200, _anth_public(b, base))
            else:
                raise BadRequest(404, f"no route {method} {path}")


# Wire formats -----------------------------------------------------------------------


def faulty(api: str, lines: list[dict[str, Any]], faults: tuple[str, ...]) -> bytes:
    """The results JSONL of ``lines`` carrying ``faults`` (config.RESULT_FAULTS)."""
    if not faults or not lines:
        return _jsonl(lines)
    lines = [dict(x) for x in lines]
    first, last = dict(lines[0]), lines[-1]
    if "unknown_id" in faults:  # the last answer under an id that names no request
        last["custom_id"] = last["custom_id"][: len(last["custom_id"]) // 2]
    if "not_object" in faults:
        lines[0] = {**lines[0], ("result" if api == "anthropic" else "response"): "oops"}
    if "duplicate" in faults:
        lines.append(dict(first))
    if "empty_id" in faults:
        lines.append({**first, "custom_id": ""})
    data = _jsonl(lines)
    if "not_json" in faults:
        data += b'{"custom_id": "cut off mid-line\n'
    return data


def _failure(api: str, status: int, kind: str, message: str) -> dict[str, Any]:
    if api == "anthropic":
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return {"status": status, "body": body}


def _openai_status(b: _Batch, now: float) -> str:
    if b.ended:
        return b.ended_as
    if b.cancel_at is not None:
        return "cancelling"
    if now >= b.created + 0.9 * b.latency and not b.expire:
        return "finalizing"
    return "in_progress"


def _openai_public(b: _Batch, now: float) -> dict[str, Any]:
    status = _openai_status(b, now)
    if now == b.created and not b.errors:
        status = "validating"  # the create answer: validation has not been reported yet
    at = int(b.ended_at) if b.ended_at is not None else None
    answered = b.results
    completed = sum(1 for r in answered if r is not None and r["status"] == 200)
    started = None if b.errors else int(b.created)
    return {
        "id": b.id,
        "object": "batch",
        "endpoint": b.endpoint,
        "model": b.model,
        "errors": {"object": "list", "data": b.errors} if b.errors else None,
        "input_file_id": b.input_file_id,
        "completion_window": b.window,
        "status": status,
        "output_file_id": b.output_file_id,
        "error_file_id": b.error_file_id,
        "created_at": int(b.created),
        "in_progress_at": started if status != "validating" else None,
        "expires_at": int(b.created) + WINDOW,
        "finalizing_at": int(b.created + 0.9 * b.latency)
        if status in ("finalizing", "completed")
        else None,
        "completed_at": at if b.ended_as == "completed" else None,
        "failed_at": at if b.ended_as == "failed" else None,
        "expired_at": at if b.ended_as == "expired" else None,
        "cancelling_at": int(b.cancel_at) if b.cancel_at is not None else None,
        "cancelled_at": at if b.ended_as == "cancelled" else None,
        "request_counts": {
            "total": len(b.requests),
            "completed": completed,
            "failed": len(answered) - completed,
        },
        "usage": {
            "input_tokens": b.tokens[0],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": b.tokens[1],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": sum(b.tokens),
        },
        "metadata": b.metadata,
    }


def _openai_page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    if after is not None:
        ids = [x["id"] for x in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }


def _anth_status(b: _Batch) -> str:
    if b.ended:
        return "ended"
    return "canceling" if b.cancel_at is not None else "in_progress"


def _rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _anth_results(b: _Batch) -> list[dict[str, Any]]:
    lines = []
    for i, (custom_id, _) in enumerate(b.requests):
        result: dict[str, Any]
        if i < len(b.results):
            answered = b.results[i]
            assert answered is not None
            if answered["status"] == 200:
                result = {"type": "succeeded", "message": answered["body"]}
            else:
                result = {"type": "errored", "error": answered["body"]}
        else:
            result = {"type": "expired" if b.expire else "canceled"}
        lines.append({"custom_id": custom_id, "result": result})
    return lines


def _anth_public(b: _Batch, base: str) -> dict[str, Any]:
    counts = {"processing": len(b.requests), "succeeded": 0, "errored": 0}
    counts.update(canceled=0, expired=0)
    if b.ended:
        counts["processing"] = 0
        for line in _anth_results(b):
            kind = line["result"]["type"]
            counts[kind] = counts.get(kind, 0) + 1
        counts["succeeded"] = counts.pop("succeeded", 0)
    return {
        "id": b.id,
        "type": "message_batch",
        "processing_status": _anth_status(b),
        "request_counts": counts,
        "ended_at": _rfc3339(b.ended_at),
        "created_at": _rfc3339(b.created),
        "expires_at": _rfc3339(b.created + WINDOW),
        "archived_at": None,
        "cancel_initiated_at": _rfc3339(b.cancel_at),
        "results_url": f"{base}/v1/messages/batches/{b.id}/results" if b.ended else None,
    }


def _anth_page(items: list[dict[str, Any]], query: dict[str, str], limit: int) -> dict[str, Any]:
    ids = [x["id"] for x in items]
    if "after_id" in query:
        after = query["after_id"]
        items = items[ids.index(after) + 1 :] if after in ids else []
        page, more = items[:limit], len(items) > limit
    elif "before_id" in query:
        before = query["before_id"]
        items = items[: ids.index(before)] if before in ids else []
        page, more = items[-limit:], len(items) > limit
    else:
        page, more = items[:limit], len(items) > limit
    return {
        "data": page,
        "has_more": more,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
    }


# Input --------------------------------------------------------------------------------


def _read(h: Exchange, limit: int, what: str) -> bytes:
    try:
        length = int(h.headers.get("content-length") or 0)
    except ValueError:
        length = -1
    if length < 0:
        h.close_connection = True
        raise BadRequest(400, "bad Content-Length")
    if length > limit:
        h.close_connection = True  # not read: the connection closes instead
        raise BadRequest(
            413,
            f"{what} of {length} bytes is over the limit of {limit}",
            what,
            kind="request_too_large",
        )
    return h.rfile.read(length) if length else b""


def _json_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        raise BadRequest(400, "body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "body must be a JSON object")
    return body


def _multipart(content_type: str, raw: bytes) -> tuple[str, str, bytes]:
    """The (filename, purpose, bytes) of a ``multipart/form-data`` upload."""
    if not content_type.startswith("multipart/form-data"):
        raise BadRequest(400, "upload a file as multipart/form-data")
    message = BytesParser(policy=HTTP).parsebytes(
        b"content-type: " + content_type.encode("latin-1") + b"\r\n\r\n" + raw
    )
    fields: dict[str, tuple[str, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(data, bytes):
            fields[name] = (part.get_filename() or "", data)
    if "file" not in fields:
        raise BadRequest(400, "'file' is a required property", "file")
    purpose = fields.get("purpose", ("", b""))[1].decode("utf-8", "replace")
    if purpose not in ("batch", "assistants", "fine-tune", "vision", "user_data", "evals"):
        raise BadRequest(400, f"'{purpose}' is not a valid purpose", "purpose")
    filename, data = fields["file"]
    if len(data) > OPENAI_MAX_FILE_BYTES:
        raise BadRequest(
            400,
            f"file of {len(data)} bytes is over the limit of {OPENAI_MAX_FILE_BYTES} bytes",
            "file",
        )
    return filename or "upload.jsonl", purpose, data


def _check_openai_lines(data: bytes) -> None:
    """A batch input file: one request a line, unique custom_ids, at most 50,000 lines."""
    seen: set[str] = set()
    n = 0
    for n, raw in enumerate((x for x in data.splitlines() if x.strip()), 1):
        if n > OPENAI_MAX_REQUESTS:
            raise BadRequest(400, f"file has over {OPENAI_MAX_REQUESTS} requests", "file")
        try:
            line = json.loads(raw)
        except ValueError:
            raise BadRequest(400, f"line {n} is not JSON", "file") from None
        if not isinstance(line, dict):
            raise BadRequest(400, f"line {n} must be a JSON object", "file")
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            raise BadRequest(400, f"line {n}: custom_id must be a non-empty string", "file")
        if custom_id in seen:
            raise BadRequest(400, f"line {n}: custom_id {custom_id!r} is duplicated", "file")
        seen.add(custom_id)
        if line.get("method") != "POST":
            raise BadRequest(400, f"line {n}: method must be 'POST'", "file")
        if line.get("url") not in OPENAI_ENDPOINTS:
            raise BadRequest(
                400, f"line {n}: url must be one of {', '.join(OPENAI_ENDPOINTS)}", "file"
            )
        if not isinstance(line.get("body"), dict):
            raise BadRequest(400, f"line {n}: body must be a JSON object", "file")
    if n == 0:
        raise BadRequest(400, "a batch file needs at least one request line", "file")


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > METADATA_MAX_PAIRS:
        raise BadRequest(
            400, f"metadata must be an object of at most {METADATA_MAX_PAIRS} pairs", "metadata"
        )
    for k, v in value.items():
        if len(k) > METADATA_KEY_MAX or not isinstance(v, str) or len(v) > METADATA_VALUE_MAX:
            raise BadRequest(
                400,
                f"metadata keys are at most {METADATA_KEY_MAX} characters and "
                f"values strings of at most {METADATA_VALUE_MAX}",
                "metadata",
            )
    return dict(value)


def _anthropic_requests(body: dict[str, Any]) -> list[tuple[str, Any]]:
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        raise BadRequest(400, "requests: a non-empty list is required")
    if len(requests) > ANTHROPIC_MAX_REQUESTS:
        raise BadRequest(
            400, f"requests: at most {ANTHROPIC_MAX_REQUESTS} per batch, got {len(requests)}"
        )
    seen: set[str] = set()
    out = []
    for i, r in enumerate(requests):
        custom_id = r.get("custom_id") if isinstance(r, dict) else None
        if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
            raise BadRequest(400, f"requests.{i}.custom_id: must match ^[a-zA-Z0-9_-]{{1,64}}$")
        if custom_id in seen:
            raise BadRequest(400, f"requests.{i}.custom_id: {custom_id!r} is used more than once")
        seen.add(custom_id)
        if not isinstance(r.get("params"), dict):
            raise BadRequest(400, f"requests.{i}.params: an object is required")
        out.append((custom_id, r["params"]))
    return out


def _limit(query: dict[str, str], default: int, most: int) -> int:
    raw = query.get("limit", str(default))
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= most:
        raise BadRequest(400, f"limit must be between 1 and {most}, not {raw!r}", "limit")
    return limit


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(x, ensure_ascii=False).encode("utf-8") + b"\n" for x in lines)


def _send_bytes(h: Exchange, data: bytes, content_type: str) -> None:
    try:
        h.send_response(200)
        h.send_header("content-type", content_type)
        h.send_header("content-length", str(len(data)))
        h.send_header("x-request-id", uuid.uuid4().hex)
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()
    except OSError:
        h.close_connection = True
