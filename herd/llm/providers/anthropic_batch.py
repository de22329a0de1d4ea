"""Anthropic's Message Batches: the requests go in one call, the results come as JSONL.

Anthropic has no file upload, so ``upload`` only keeps the requests (in this process)
and returns a local marker; ``create`` posts them. Its batches carry no metadata, so
the handle travels in every request's custom_id instead: ``<prefix>-<key>``, the
handle's first PREFIX characters and the whole cache key, its 32 bytes in unpadded
base64url (43 characters: custom_id allows 64 of ``[a-zA-Z0-9_-]``, and a key's 64 hex
would not fit beside the handle). The encoding is one-to-one, so batch_poll matches
each result line to its key exactly (``custom_id``), never by a prefix: a line whose
id is empty, cut short or another's answers no key.

``find`` lists the account's batches newest first and reads the first result line of
each ended one created since the handle was made (the handle starts with its creation
time in milliseconds, as hex; batches made before it, less CLOCK_SKEW, cannot be its).
The API shows no custom_id of a batch in progress, so a batch in progress in that
window cannot be told apart from this handle's: ``find`` then asks to be run again
once it may have ended (Snooze) rather than risk a second, billed batch. batch_submit
calls ``find`` only when a predecessor may have created one (a takeover), so a first
run never waits on the other chunks' batches. It reads MAX_PAGES pages at most, then
refuses with an error rather than list without end.

Results are read line by line as they arrive and handed on one at a time.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator, AsyncIterator
from datetime import datetime
from typing import Any

import httpx

from herd.errors import Snooze
from herd.llm.errors import ProviderError, ProviderResponseInvalid
from herd.llm.providers.anthropic import Anthropic
from herd.llm.providers.base import excerpt
from herd.llm.providers.batch import Found, ProviderBatch, Request, Result
from herd.llm.providers.openai_batch import UNREADABLE, json_line

MAX_REQUESTS = 100_000
PAGE = 100  # batches per list page (Anthropic allows up to 1,000)
PREFIX = 20  # the handle's first characters: 12 of time, 8 random
KEY_CHARS = 43  # a 32-byte key in unpadded base64url; PREFIX + 1 + KEY_CHARS = 64
LEGACY_KEY_CHARS = 43  # the hex of the key that custom_ids carried before (legacy_ids)
# Pages of PAGE batches ``find`` reads before giving up: newest first, it stops at the
# handle's time, so this many means batches made faster than it can tell apart.
MAX_PAGES = 100
CLOCK_SKEW = 600.0  # seconds between this machine's clock and the provider's
FIND_RETRY = 30.0  # seconds before a takeover looks again at a batch in progress
MARKER = "local:"


def handle_time(handle: str) -> float | None:
    """When the handle was made (seconds since the epoch), from its first 12 hex."""
    try:
        return int(handle[:12], 16) / 1000
    except ValueError:
        return None


def wire_id(handle: str, key: str) -> str:
    """``key`` (64 hex) under ``handle``'s prefix, whole: one id per key, one key per id."""
    try:
        raw = bytes.fromhex(key)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ValueError(f"a batch request's key is 64 hex characters, not {key!r}")
    return f"{handle[:PREFIX]}-{base64.urlsafe_b64encode(raw).decode().rstrip('=')}"


def _seconds(stamp: Any) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class AnthropicBatch(Anthropic):
    """The Message Batches API of Anthropic (or of the simulator)."""

    max_requests = MAX_REQUESTS

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        # Requests "uploaded" and not yet created, by marker: popped by create.
        self._pending: dict[str, list[dict[str, Any]]] = {}

    def _headers(self) -> dict[str, str]:
        return {"x-api-key": self._api_key or "", "anthropic-version": self.version}

    def _fail(self, method: str, path: str, response: httpx.Response) -> ProviderError:
        body = excerpt(response.text, self._api_key)
        return ProviderError(
            f"{self.name} batch API {method} {path} answered {response.status_code}: {body}",
            provider=self.name,
            model=self.model,
            status=response.status_code,
            body=body,
        )

    def _transport(self, method: str, path: str, exc: Exception) -> ProviderError:
        return ProviderError(
            f"{self.name} batch API {method} {path}: {type(exc).__name__}",
            provider=self.name,
            model=self.model,
        )

    async def _json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        try:
            response = await self._client.request(
                method, self.base_url + path, headers=self._headers(), **kw
            )
        except httpx.HTTPError as exc:
            raise self._transport(method, path, exc) from exc
        if response.status_code >= 400:
            raise self._fail(method, path, response)
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise ProviderResponseInvalid(
                f"{self.name} batch API {path}: the answer is not a JSON object",
                provider=self.name,
            )
        return data

    async def _lines(self, batch_id: str) -> AsyncGenerator[str, None]:
        path = f"/v1/messages/batches/{batch_id}/results"
        try:
            async with self._client.stream(
                "GET", self.base_url + path, headers=self._headers()
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise self._fail("GET", path, response)
                async for raw in response.aiter_lines():
                    yield raw
        except httpx.HTTPError as exc:
            raise self._transport("GET", path, exc) from exc

    async def _first_id(self, batch_id: str) -> str | None:
        """The custom_id of a batch's first readable result line."""
        lines = self._lines(batch_id)
        try:
            async for raw in lines:
                line = json_line(raw) if raw.strip() else None
                if line is not None:
                    return str(line["custom_id"])
        finally:
            await lines.aclose()  # the rest of the file is not read
        return None

    async def find(self, handle: str) -> Found:
        made = handle_time(handle)
        since = None if made is None else made - CLOCK_SKEW
        prefix = handle[:PREFIX] + "-"
        after: str | None = None
        for _ in range(MAX_PAGES):
            query: dict[str, Any] = {"limit": PAGE, **({"after_id": after} if after else {})}
            page = await self._json("GET", "/v1/messages/batches", params=query)
            items = page.get("data") or []
            for b in items:
                created = _seconds(b.get("created_at"))
                if since is not None and created is not None and created < since:
                    return Found()  # newest first: the rest are older still
                batch_id = str(b["id"])
                if b.get("processing_status") != "ended":
                    raise Snooze(
                        f"anthropic batch {batch_id} is in progress and may be handle"
                        f" {handle}'s: looking again once it may have ended",
                        after=FIND_RETRY,
                    )
                first = await self._first_id(batch_id)
                if first is not None and first.startswith(prefix):
                    return Found(file_id=MARKER + handle, batch_id=batch_id)
            if not page.get("has_more") or not items:
                return Found()
            after = str(items[-1]["id"])
        raise ProviderError(
            f"{self.name} batch: more than {MAX_PAGES} pages of {PAGE} batches made since"
            f" handle {handle}; herd does not look further for a batch it may have made",
            provider=self.name,
            model=self.model,
        )

    async def upload(self, handle: str, requests: list[Request]) -> str:
        lines: list[dict[str, Any]] = []
        for r in requests:
            custom_id = self.custom_id(handle, r.custom_id)
            _, _, body = self._request(r.system, r.user, r.schema, r.params)
            body.pop("stream", None)  # a batch request is never streamed
            lines.append({"custom_id": custom_id, "params": body})
        marker = MARKER + handle
        self._pending[marker] = lines
        return marker

    async def create(self, handle: str, file_id: str) -> str:
        lines = self._pending.pop(file_id, None)
        if lines is None:
            raise ProviderError(
                f"{self.name} batch: no requests kept for {file_id} in this process",
                provider=self.name,
                model=self.model,
            )
        found = await self._json("POST", "/v1/messages/batches", json={"requests": lines})
        return str(found["id"])

    async def retrieve(self, batch_id: str) -> ProviderBatch:
        b = await self._json("GET", f"/v1/messages/batches/{batch_id}")
        status = str(b.get("processing_status"))
        return ProviderBatch(id=batch_id, status=status, ended=status == "ended")

    async def cancel(self, batch_id: str) -> ProviderBatch:
        try:
            await self._json("POST", f"/v1/messages/batches/{batch_id}/cancel")
        except ProviderError as exc:
            if exc.status != 409:  # 409: it has ended or is being canceled already
                raise
        return await self.retrieve(batch_id)

    def custom_id(self, handle: str, key: str) -> str:
        return wire_id(handle, key)

    def legacy_ids(self, handle: str, keys: list[str]) -> dict[str, str]:
        """The ids of batches created before custom_ids carried whole keys (a batch runs
        for up to 24 hours, across an upgrade): the handle's prefix and the key's first
        LEGACY_KEY_CHARS hex. Matched whole, never by a prefix; one two keys of the
        chunk share names neither (that herd refused such a chunk at upload)."""
        out: dict[str, str] = {}
        shared: set[str] = set()
        for key in keys:
            old = f"{handle[:PREFIX]}-{key[:LEGACY_KEY_CHARS]}"
            if out.setdefault(old, key) != key:
                shared.add(old)
        return {i: k for i, k in out.items() if i not in shared}

    async def results(self, batch: ProviderBatch) -> AsyncIterator[Result]:
        n = 0
        async for raw in self._lines(batch.id):
            n += 1
            if not raw.strip():
                continue
            line = json_line(raw)
            if line is None:
                yield Result(None, error=f"line {n} is not a JSON object with a custom_id",
                             malformed=True)  # fmt: skip
                continue
            yield self._result(line)

    def _result(self, line: dict[str, Any]) -> Result:
        custom_id = line["custom_id"]
        result = line.get("result")
        if not isinstance(result, dict):
            return Result(custom_id, error="the line's result is not an object", malformed=True)
        kind = result.get("type")
        if kind == "succeeded":
            # Answered: billed, whether or not the answer can be read.
            try:
                text, usage, model, _, _ = self._parse(result["message"])
            except UNREADABLE as exc:
                return Result(custom_id, error=f"unreadable answer: {exc!r}", billed=True)
            return Result(custom_id, text=text, usage=usage, model=model, billed=True)
        if kind == "errored":
            outer = result.get("error")
            error = outer.get("error") if isinstance(outer, dict) else None
            if not isinstance(error, dict):
                return Result(custom_id, error=f"error: {str(outer)[:200]}")
            return Result(custom_id, error=f"{error.get('type')}: {error.get('message')}")
        return Result(custom_id, error=f"the request was {kind}")
