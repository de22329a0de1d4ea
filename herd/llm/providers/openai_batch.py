"""OpenAI's Batch API: a JSONL file of chat-completion requests, then a batch over it.

The handle herd recorded before uploading names the file (``herd-<handle>.jsonl``)
and is the batch's metadata (``herd_handle``), so ``find`` recognises both by listing
the account's files and batches, newest first, page by page.
"""

from __future__ import annotations

import json
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


def filename(handle: str) -> str:
    return f"herd-{handle}.jsonl"


class OpenAIBatch(OpenAICompatible):
    """The Batch API of an OpenAI-compatible server (OpenAI's own, or the simulator)."""

    max_requests = MAX_REQUESTS

    def _headers(self) -> dict[str, str]:
        key = self._api_key
        return {"authorization": f"Bearer {key}"} if key else {}

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = await self._client.request(
                method, self.base_url + path, headers=self._headers(), **kw
            )
        except httpx.HTTPError as exc:
            raise ProviderError(
                f"{self.name} batch API {method} {path}: {type(exc).__name__}",
                provider=self.name,
                model=self.model,
            ) from exc
        if response.status_code >= 400:
            body = excerpt(response.text, self._api_key)
            raise ProviderError(
                f"{self.name} batch API {method} {path} answered {response.status_code}: {body}",
                provider=self.name,
                model=self.model,
                status=response.status_code,
                body=body,
            )
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
        while True:
            query = {**params, **({"after": after} if after else {})}
            page = await self._json("GET", path, params=query)
            items = page.get("data") or []
            for item in items:
                yield item
            if not page.get("has_more") or not items:
                return
            after = str(items[-1]["id"])

    async def find(self, handle: str) -> Found:
        batch_id = None
        async for b in self._pages("/batches", {"limit": PAGE}):
            if (b.get("metadata") or {}).get("herd_handle") == handle:
                batch_id = str(b["id"])
                break
        file_id = None
        async for f in self._pages("/files", {"purpose": "batch", "limit": 10_000}):
            if f.get("filename") == filename(handle):
                file_id = str(f["id"])
                break
        return Found(file_id=file_id, batch_id=batch_id)

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

    async def _lines(self, file_id: str | None) -> list[dict[str, Any]]:
        if not file_id:
            return []
        response = await self._call("GET", f"/files/{file_id}/content")
        out = []
        for raw in response.content.splitlines():
            if raw.strip():
                line = json.loads(raw)
                if isinstance(line, dict) and isinstance(line.get("custom_id"), str):
                    out.append(line)
        return out

    async def results(self, batch: ProviderBatch) -> list[Result]:
        out: list[Result] = []
        for line in await self._lines(batch.output_file_id) + await self._lines(
            batch.error_file_id
        ):
            custom_id = line["custom_id"]
            response = line.get("response") or {}
            if line.get("error") or response.get("status_code") != 200:
                error = line.get("error") or (response.get("body") or {}).get("error") or {}
                code = error.get("code") or response.get("status_code")
                message = error.get("message") if isinstance(error, dict) else str(error)
                out.append(Result(custom_id, error=f"{code}: {message}"))
                continue
            try:
                text, usage, model, _, _ = self._parse(response["body"])
            except (KeyError, IndexError, TypeError, ValueError) as exc:
                out.append(Result(custom_id, error=f"unreadable answer: {exc}"))
                continue
            out.append(Result(custom_id, text=text, usage=usage, model=model))
        return out
