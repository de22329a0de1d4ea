"""OpenAI's Batch API: a JSONL file of chat-completion requests, then a batch over it.

The handle herd recorded before uploading names the file (``herd-<handle>.jsonl``)
and is the batch's metadata (``herd_handle``), so ``find`` recognises both by listing
the account's files and batches, newest first, page by page, MAX_PAGES at most: an
account with more than that is refused with an error rather than listed without end.

A request's custom_id is its cache key itself. Result files are read line by line as
they arrive (``parse_lines`` takes an async iterator of lines), never whole: a 200 MB
file held whole, split and parsed took a worker from 114 to 662 MB. A line that is not
JSON, not an object, or whose ``error``/``response`` is not an object is reported as
malformed (batch_poll counts and logs it) instead of failing the whole batch.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import httpx

from herd.llm.errors import ProviderError, ProviderResponseInvalid
from herd.llm.providers.base import excerpt
from herd.llm.providers.batch import Found, ProviderBatch, Request, Result
from herd.llm.providers.openai import OpenAICompatible

ENDPOINT = "/v1/chat/completions"
ENDED = ("completed", "failed", "expired", "cancelled")
MAX_REQUESTS = 50_000
PAGE = 100  # batches per list page: OpenAI's most
FILE_PAGE = 10_000  # files per list page: OpenAI's most
# Pages ``find`` reads of each list before giving up: 20,000 batches, 2,000,000 files.
# The handle's batch is among the newest (find runs minutes after the handle is made);
# past this the account holds more than herd can tell apart, and a takeover must not
# guess (it could make a second, billed batch).
MAX_PAGES = 200
UNREADABLE = (KeyError, IndexError, TypeError, ValueError, AttributeError)


def filename(handle: str) -> str:
    return f"herd-{handle}.jsonl"


def json_line(raw: str) -> dict[str, Any] | None:
    """A result line as an object with a string ``custom_id``, or None if it is not one."""
    try:
        line = json.loads(raw)
    except ValueError:
        return None
    if isinstance(line, dict) and isinstance(line.get("custom_id"), str):
        return line
    return None


class OpenAIBatch(OpenAICompatible):
    """The Batch API of an OpenAI-compatible server (OpenAI's own, or the simulator)."""

    max_requests = MAX_REQUESTS

    def _headers(self) -> dict[str, str]:
        key = self._api_key
        return {"authorization": f"Bearer {key}"} if key else {}

    def _transport(self, method: str, path: str, exc: Exception) -> ProviderError:
        return ProviderError(
            f"{self.name} batch API {method} {path}: {type(exc).__name__}",
            provider=self.name,
            model=self.model,
        )

    def _fail(self, method: str, path: str, response: httpx.Response) -> ProviderError:
        body = excerpt(response.text, self._api_key)
        return ProviderError(
            f"{self.name} batch API {method} {path} answered {response.status_code}: {body}",
            provider=self.name,
            model=self.model,
            status=response.status_code,
            body=body,
        )

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = await self._client.request(
                method, self.base_url + path, headers=self._headers(), **kw
            )
        except httpx.HTTPError as exc:
            raise self._transport(method, path, exc) from exc
        if response.status_code >= 400:
            raise self._fail(method, path, response)
        return response

    async def _json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        response = await self._call(method, path, **kw)
        try:
            data = response.json()
        except ValueError:
            raise ProviderResponseInvalid(
                f"{self.name} batch API {path}: the answer is not JSON", provider=self.name
            ) from None
        if not isinstance(data, dict):
            raise ProviderResponseInvalid(f"{self.name} batch API {path}: not an object")
        return data

    async def _pages(self, path: str, params: dict[str, Any]) -> Any:
        after: str | None = None
        for _ in range(MAX_PAGES):
            query = {**params, **({"after": after} if after else {})}
            page = await self._json("GET", path, params=query)
            items = page.get("data") or []
            for item in items:
                yield item
            if not page.get("has_more") or not items:
                return
            after = str(items[-1]["id"])
        raise ProviderError(
            f"{self.name} batch API {path}: still more after {MAX_PAGES} pages of"
            f" {params.get('limit')}; herd does not look further for a batch it may have"
            " made (delete old files and batches, or raise openai_batch.MAX_PAGES)",
            provider=self.name,
            model=self.model,
        )

    async def find(self, handle: str) -> Found:
        batch_id = None
        async for b in self._pages("/batches", {"limit": PAGE}):
            if (b.get("metadata") or {}).get("herd_handle") == handle:
                batch_id = str(b["id"])
                break
        file_id = None
        async for f in self._pages("/files", {"purpose": "batch", "limit": FILE_PAGE}):
            if f.get("filename") == filename(handle):
                file_id = str(f["id"])
                break
        return Found(file_id=file_id, batch_id=batch_id)

    def custom_id(self, handle: str, key: str) -> str:
        return key  # a key is 64 hex; OpenAI's custom_id holds it whole

    def legacy_ids(self, handle: str, keys: list[str]) -> dict[str, str]:
        return {}  # the custom_id has always been the key

    def line(self, request: Request) -> dict[str, Any]:
        _, _, body = self._request(request.system, request.user, request.schema, request.params)
        return {"custom_id": request.custom_id, "method": "POST", "url": ENDPOINT, "body": body}

    async def upload(self, handle: str, requests: list[Request]) -> str:
        data = b"".join(json.dumps(self.line(r)).encode() + b"\n" for r in requests)
        found = await self._json(
            "POST",
            "/files",
            data={"purpose": "batch"},
            files={"file": (filename(handle), data, "application/jsonl")},
        )
        return str(found["id"])

    async def create(self, handle: str, file_id: str) -> str:
        body = {
            "input_file_id": file_id,
            "endpoint": ENDPOINT,
            "completion_window": "24h",
            "metadata": {"herd_handle": handle},
        }
        return str((await self._json("POST", "/batches", json=body))["id"])

    async def retrieve(self, batch_id: str) -> ProviderBatch:
        b = await self._json("GET", f"/batches/{batch_id}")
        status = str(b.get("status"))
        return ProviderBatch(
            id=batch_id,
            status=status,
            ended=status in ENDED,
            output_file_id=b.get("output_file_id"),
            error_file_id=b.get("error_file_id"),
        )

    async def cancel(self, batch_id: str) -> ProviderBatch:
        try:
            await self._json("POST", f"/batches/{batch_id}/cancel")
        except ProviderError as exc:
            if exc.status != 409:  # 409: it has ended or is being cancelled already
                raise
        return await self.retrieve(batch_id)

    async def _raw_lines(self, file_id: str) -> AsyncIterator[str]:
        path = f"/files/{file_id}/content"
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

    async def results(self, batch: ProviderBatch) -> AsyncIterator[Result]:
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                async for result in self.parse_lines(self._raw_lines(file_id)):
                    yield result

    async def parse_lines(self, lines: AsyncIterable[str]) -> AsyncIterator[Result]:
        """Each line's Result as soon as the line is read."""
        n = 0
        async for raw in lines:
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
        error, response = line.get("error"), line.get("response")
        if not isinstance(error, dict | None) or not isinstance(response, dict | None):
            return Result(custom_id, error="the line's error or response is not an object",
                          malformed=True)  # fmt: skip
        if error:
            return Result(custom_id, error=f"{error.get('code')}: {error.get('message')}")
        if response is None:
            return Result(custom_id, error="the line has neither response nor error",
                          malformed=True)  # fmt: skip
        status, body = response.get("status_code"), response.get("body")
        if status != 200:
            found = body.get("error") if isinstance(body, dict) else None
            found = found if isinstance(found, dict) else {}
            return Result(custom_id, error=f"{found.get('code') or status}: {found.get('message')}")
        # Answered: billed, whether or not the answer can be read.
        try:
            text, usage, model, _, _ = self._parse(body)
        except UNREADABLE as exc:
            return Result(custom_id, error=f"unreadable answer: {exc!r}", billed=True)
        return Result(custom_id, text=text, usage=usage, model=model, billed=True)
