"""Anthropic's Message Batches: the requests go in one call, the results come as JSONL.

Anthropic has no file upload, so ``upload`` only keeps the requests (in this process)
and returns a local marker; ``create`` posts them. Its batches carry no metadata, so
the handle travels in every request's custom_id instead: ``<prefix>-<key prefix>``,
the handle's first PREFIX characters and the cache key's first KEY_CHARS (custom_id
allows 64 of ``[a-zA-Z0-9_-]``, a key is 64 hex). Results come back under the key
prefix; batch_poll matches a key by it, and ``upload`` refuses a chunk in which two
keys share one (a 172-bit prefix: never seen, but detected).

``find`` lists the account's batches newest first and reads the first result line of
each ended one created since the handle was made (the handle starts with its creation
time in milliseconds, as hex; batches made before it, less CLOCK_SKEW, cannot be its).
The API shows no custom_id of a batch in progress, so a batch in progress in that
window cannot be told apart from this handle's: ``find`` then asks to be run again
once it may have ended (Snooze) rather than risk a second, billed batch. batch_submit
calls ``find`` only when a predecessor may have created one (a takeover), so a first
run never waits on the other chunks' batches.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import httpx

from herd.errors import Snooze
from herd.llm.errors import ProviderError, ProviderResponseInvalid
from herd.llm.providers.anthropic import Anthropic
from herd.llm.providers.base import excerpt
from herd.llm.providers.batch import Found, ProviderBatch, Request, Result

MAX_REQUESTS = 100_000
PAGE = 100  # batches per list page (Anthropic allows up to 1,000)
PREFIX = 20  # the handle's first characters: 12 of time, 8 random
KEY_CHARS = 64 - PREFIX - 1
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
    return f"{handle[:PREFIX]}-{key[:KEY_CHARS]}"


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

    async def _result_lines(self, batch_id: str, first_only: bool = False) -> list[dict[str, Any]]:
        path = f"/v1/messages/batches/{batch_id}/results"
        out: list[dict[str, Any]] = []
        try:
            async with self._client.stream(
                "GET", self.base_url + path, headers=self._headers()
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise self._fail("GET", path, response)
                async for raw in response.aiter_lines():
                    if not raw.strip():
                        continue
                    try:
                        line = json.loads(raw)
                    except ValueError:
                        continue
                    if isinstance(line, dict) and isinstance(line.get("custom_id"), str):
                        out.append(line)
                        if first_only:
                            break
        except httpx.HTTPError as exc:
            raise self._transport("GET", path, exc) from exc
        return out

    async def find(self, handle: str) -> Found:
        made = handle_time(handle)
        since = None if made is None else made - CLOCK_SKEW
        prefix = handle[:PREFIX] + "-"
        after: str | None = None
        while True:
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
                first = await self._result_lines(batch_id, first_only=True)
                if first and first[0]["custom_id"].startswith(prefix):
                    return Found(file_id=MARKER + handle, batch_id=batch_id)
            if not page.get("has_more") or not items:
                return Found()
            after = str(items[-1]["id"])

    async def upload(self, handle: str, requests: list[Request]) -> str:
        lines: list[dict[str, Any]] = []
        seen: dict[str, str] = {}
        for r in requests:
            custom_id = wire_id(handle, r.custom_id)
            if seen.setdefault(custom_id, r.custom_id) != r.custom_id:
                raise ProviderError(
                    f"{self.name} batch: keys {seen[custom_id]} and {r.custom_id} share their"
                    f" first {KEY_CHARS} characters, the most a custom_id carries",
                    provider=self.name,
                    model=self.model,
                )
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

    async def results(self, batch: ProviderBatch) -> list[Result]:
        out: list[Result] = []
        for line in await self._result_lines(batch.id):
            # The key prefix: batch_poll matches its keys by it.
            custom_id = str(line["custom_id"]).partition("-")[2]
            result = line.get("result") or {}
            kind = result.get("type")
            if kind == "succeeded":
                try:
                    text, usage, model, _, _ = self._parse(result["message"])
                except (KeyError, IndexError, TypeError, ValueError) as exc:
                    out.append(Result(custom_id, error=f"unreadable answer: {exc}"))
                    continue
                out.append(Result(custom_id, text=text, usage=usage, model=model))
            elif kind == "errored":
                error = (result.get("error") or {}).get("error") or {}
                message = error.get("message") if isinstance(error, dict) else str(error)
                kind_of = error.get("type") if isinstance(error, dict) else "error"
                out.append(Result(custom_id, error=f"{kind_of}: {message}"))
            else:
                out.append(Result(custom_id, error=f"the request was {kind}"))
        return out
