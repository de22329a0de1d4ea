"""What herd needs of a provider's Batch API, whatever its wire format.

Every method is safe to call again after a crash: ``find`` is how a worker that took
a submission over learns what its predecessor already made at the provider, so
nothing is uploaded or created twice. One module per provider implements it
(herd.llm.providers.openai_batch; Anthropic's Message Batches (anthropic_batch.py)).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from herd.llm.completion import Usage


@dataclass(frozen=True)
class Request:
    """One request of a batch: ``custom_id`` is the evaluation's cache key."""

    custom_id: str
    system: str
    user: str
    schema: Mapping[str, Any] | None
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Found:
    """What the provider holds under a handle: the uploaded file's id and the batch's."""

    file_id: str | None = None
    batch_id: str | None = None


@dataclass(frozen=True)
class ProviderBatch:
    id: str
    status: str  # the provider's own word
    ended: bool
    output_file_id: str | None = None
    error_file_id: str | None = None


@dataclass(frozen=True)
class Result:
    """One request's outcome: ``text`` and ``usage`` when answered, else ``error``."""

    custom_id: str
    text: str | None = None
    usage: Usage | None = None
    model: str | None = None
    error: str | None = None


class BatchAPI(Protocol):
    name: str
    max_requests: int  # the provider's limit of requests per batch

    async def find(self, handle: str) -> Found: ...

    async def upload(self, handle: str, requests: list[Request]) -> str: ...

    async def create(self, handle: str, file_id: str) -> str: ...

    async def retrieve(self, batch_id: str) -> ProviderBatch: ...

    async def results(self, batch: ProviderBatch) -> list[Result]: ...

    # Asks the provider to stop the batch; what it answered already is still billed and
    # comes back through ``results`` once it has ended. A batch that has ended is left.
    async def cancel(self, batch_id: str) -> ProviderBatch: ...

    async def aclose(self) -> None: ...
