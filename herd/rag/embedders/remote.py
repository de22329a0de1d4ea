"""Embeddings from any server that speaks OpenAI's ``POST /v1/embeddings``.

OpenAI itself, Hugging Face TEI, vLLM, Ollama (``http://localhost:11434/v1``), a
LiteLLM proxy: the base URL includes the version prefix (``…/v1``), as in OpenAI's
SDKs. Texts go in batches of ``batch_size``; 408, 429 and 5xx answers and failed
connections are tried again, after ``Retry-After`` (seconds or an HTTP date) when
the server gives one, else after an exponential backoff with jitter.

The key (``key_for``) comes from ``api_key``, else ``HERD_EMBEDDER_API_KEY``, else
``OPENAI_API_KEY`` only where that key already goes: OpenAI's own API over https, or
the server ``OPENAI_BASE_URL`` names. The URL of a ``remote:`` spec is stored with the
collection, so whoever can write one must not be able to collect the OpenAI key. The
key is sent in the ``Authorization`` header and nowhere else: not in the ``id``, a log
line, an error or a ``repr``.

A server's weights cannot be hashed from here, so the ``id`` names the model, the
server and the request options: when a server replaces a model under the same name,
give the embedder a new ``name`` (``name="bge-m3@2026-11"``) to start a new index.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np

from herd.llm.providers.base import parse_retry_after
from herd.rag.embedders.base import EmbedError, Vectors, check_texts, empty, l2_normalize, make_id

log = logging.getLogger("herd.rag")

DEFAULT_BASE_URL = "https://api.openai.com/v1"
KEY_VARIABLE = "HERD_EMBEDDER_API_KEY"
RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})
EXCERPT_CHARS = 300


class RemoteEmbedError(EmbedError):
    """The embedding server failed to embed the texts."""

    def __init__(
        self,
        message: str | None = None,
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class RemoteEmbedder:
    """A batched ``/v1/embeddings`` client, sync (``embed``) and async (``aembed``).

    ``dim`` is asked of the server with one short request when not given (or taken
    from ``dimensions``, the size OpenAI's text-embedding-3 models cut their vectors
    to). Vectors are L2-normalized here unless ``normalize=False``. ``max_tries``
    counts the first try; a ``Retry-After`` longer than ``max_retry_after`` is not
    waited out: :class:`RemoteEmbedError` is raised at once with ``retry_after`` set,
    so a job queue can reschedule the job instead of holding a worker.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        dim: int | None = None,
        dimensions: int | None = None,
        batch_size: int = 64,
        timeout: float = 60.0,
        max_tries: int = 5,
        initial_delay: float = 0.5,
        max_delay: float = 30.0,
        max_retry_after: float = 60.0,
        normalize: bool = True,
        prefix: str = "",
        name: str | None = None,
    ) -> None:
        if batch_size < 1 or max_tries < 1:
            raise ValueError("batch_size and max_tries must be at least 1")
        self.model = model
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip(
            "/"
        )
        self._key = api_key or key_for(self.base_url)
        self.dimensions, self.batch_size, self.timeout = dimensions, batch_size, timeout
        self.max_tries, self.initial_delay, self.max_delay = max_tries, initial_delay, max_delay
        self.max_retry_after, self.normalize, self.prefix = max_retry_after, normalize, prefix
        self._client: httpx.Client | None = httpx.Client(timeout=timeout, headers=self._headers())
        params: dict[str, object] = {
            "server": _public_url(self.base_url),
            "normalize": "l2" if normalize else "none",
            "prefix": prefix,
        }
        if dimensions is not None:
            params["dimensions"] = dimensions
        self.id = make_id("remote", name or model, params)
        self.dim = dim or dimensions or len(self._post_sync(["dimension"])[0])

    @property
    def url(self) -> str:
        return f"{self.base_url}/embeddings"

    def embed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        if not items:
            return empty(self.dim)
        rows = [self._post_sync(batch) for batch in self._batches(items)]
        return self._finish(rows)

    async def aembed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        if not items:
            return empty(self.dim)
        async with httpx.AsyncClient(timeout=self.timeout, headers=self._headers()) as client:
            rows = [await self._post_async(client, batch) for batch in self._batches(items)]
        return self._finish(rows)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> RemoteEmbedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteEmbedder({self.id!r})"

    # The policy, shared by both paths.

    def _batches(self, items: list[str]) -> list[list[str]]:
        items = [self.prefix + t for t in items] if self.prefix else items
        return [items[s : s + self.batch_size] for s in range(0, len(items), self.batch_size)]

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    def _body(self, batch: list[str]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "input": batch, "encoding_format": "float"}
        if self.dimensions is not None:
            body["dimensions"] = self.dimensions
        return body

    def _finish(self, rows: list[list[list[float]]]) -> Vectors:
        vectors = np.asarray([v for batch in rows for v in batch], dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise RemoteEmbedError(
                f"the server sent vectors of shape {vectors.shape}, not (n, {self.dim})"
            )
        return l2_normalize(vectors) if self.normalize else vectors

    def _read(self, response: httpx.Response, count: int) -> list[list[float]]:
        try:
            data = response.json()["data"]
            ordered = sorted(data, key=lambda d: int(d.get("index", 0)))
            vectors = [[float(x) for x in d["embedding"]] for d in ordered]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            excerpt = self._excerpt(response)
            raise RemoteEmbedError(f"{self.url} sent no embeddings list: {excerpt}") from exc
        if len(vectors) != count or len({len(v) for v in vectors}) > 1:
            raise RemoteEmbedError(f"{self.url} sent {len(vectors)} vectors for {count} texts")
        return vectors

    def _decide(
        self, attempt: int, response: httpx.Response | None, error: Exception | None
    ) -> float:
        """Seconds to wait before the next try, or raise if there is none to make."""
        if response is not None:
            status = response.status_code
            retry_after = parse_retry_after(response.headers)
            message = f"{self.url} answered {status}: {self._excerpt(response)}"
            if status not in RETRY_STATUSES:
                raise RemoteEmbedError(message, status=status)
            if retry_after is not None and retry_after > self.max_retry_after:
                raise RemoteEmbedError(message, status=status, retry_after=retry_after)
        else:
            status, retry_after = None, None
            reason = f"{type(error).__name__}: {self._redact(str(error))}"
            message = f"{self.url} could not be reached: {reason}"
        if attempt >= self.max_tries:
            raise RemoteEmbedError(f"{message} (gave up after {attempt} tries)", status=status)
        if retry_after is not None:
            delay = retry_after * (1.0 + 0.1 * random.random())
        else:
            delay = min(self.max_delay, self.initial_delay * 2.0 ** (attempt - 1))
            delay *= 1.0 - 0.5 * random.random()
        log.warning(
            "embedding request failed (%s); try %d of %d in %.1f s",
            status if status is not None else type(error).__name__,
            attempt + 1,
            self.max_tries,
            delay,
        )
        return delay

    def _post_sync(self, batch: list[str]) -> list[list[float]]:
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout, headers=self._headers())
        for attempt in range(1, self.max_tries + 1):
            response: httpx.Response | None = None
            error: Exception | None = None
            try:
                response = self._client.post(self.url, json=self._body(batch))
            except httpx.TransportError as exc:
                error = exc
            if response is not None and response.is_success:
                return self._read(response, len(batch))
            time.sleep(self._decide(attempt, response, error))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _post_async(self, client: httpx.AsyncClient, batch: list[str]) -> list[list[float]]:
        for attempt in range(1, self.max_tries + 1):
            response: httpx.Response | None = None
            error: Exception | None = None
            try:
                response = await client.post(self.url, json=self._body(batch))
            except httpx.TransportError as exc:
                error = exc
            if response is not None and response.is_success:
                return self._read(response, len(batch))
            await asyncio.sleep(self._decide(attempt, response, error))
        raise AssertionError("unreachable")  # pragma: no cover

    def _excerpt(self, response: httpx.Response) -> str:
        text = " ".join(response.text.split())
        if len(text) > EXCERPT_CHARS:
            text = text[:EXCERPT_CHARS] + "…"
        return self._redact(text) or "(no body)"

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "[REDACTED]") if self._key else text


def key_for(base_url: str) -> str | None:
    """The key to send to the embedding server at ``base_url``, or None (see the module)."""
    own = os.environ.get(KEY_VARIABLE)
    if own:
        return own
    openai_key = os.environ.get("OPENAI_API_KEY")
    if not openai_key:
        return None
    target = _origin(base_url)
    if target == _origin(DEFAULT_BASE_URL):
        return openai_key
    configured = os.environ.get("OPENAI_BASE_URL")
    # The LLM provider sends the key to OPENAI_BASE_URL already: the same server may have it.
    if configured and target == _origin(configured):
        return openai_key
    return None


def _origin(url: str) -> tuple[str, str, int | None]:
    """Scheme, host and port: where a request goes (an http URL to OpenAI's host is not
    OpenAI's https origin)."""
    parts = urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:  # a port that is no number: matches nothing
        return ("", "", None)
    return (parts.scheme, (parts.hostname or "").rstrip("."), port)


def _public_url(url: str) -> str:
    """The URL without credentials or query (which may carry a key)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
