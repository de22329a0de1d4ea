"""What herd needs of a provider's Batch API, whatever its wire format.

Every method is safe to call again after a crash: ``find`` is how a worker that took
a submission over learns what its predecessor already made at the provider, so
nothing is uploaded or created twice. One module per provider implements it
(herd.llm.providers.openai_batch; Anthropic's Message Batches (anthropic_batch.py)).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
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
    """One line of a batch's results: ``text`` and ``usage`` when answered, else ``error``.

    ``custom_id`` is the id exactly as the line carries it (batch_poll matches it against
    ``BatchAPI.custom_id`` of its keys, never by prefix); None for a line that could not
    be read at all (not JSON, not an object, no string id): counted and skipped.
    ``billed``: the provider charges the line (it answered), even when its answer or
    usage could not be read (``usage`` None then). ``malformed``: the line does not
    follow the wire format; counted and logged by the poll (its key, if any, fails)."""

    custom_id: str | None
    text: str | None = None
    usage: Usage | None = None
    model: str | None = None
    error: str | None = None
    billed: bool = False
    malformed: bool = False


class BatchAPI(Protocol):
    name: str
    max_requests: int  # the provider's limit of requests per batch

    @property
    def key_id(self) -> str:
        """The id of the key its batches are made with (a hash prefix, never the key)."""
        ...

    async def find(self, handle: str) -> Found: ...

    async def upload(self, handle: str, requests: list[Request]) -> str: ...

    async def create(self, handle: str, file_id: str) -> str: ...

    async def retrieve(self, batch_id: str) -> ProviderBatch: ...

    # The custom_id a request for ``key`` goes under in the chunk ``handle``: one id per
    # key, so the poll inverts it exactly (a table of its keys' ids).
    def custom_id(self, handle: str, key: str) -> str: ...

    # Ids an older herd gave requests of the chunk (a batch that ran across an upgrade),
    # each naming one key whole: {id: key}, matched exactly as custom_id's are.
    def legacy_ids(self, handle: str, keys: list[str]) -> dict[str, str]: ...

    # The result lines one at a time, read as they arrive (a result file may be hundreds
    # of megabytes: it is never held whole).
    def results(self, batch: ProviderBatch) -> AsyncIterator[Result]: ...

    # Asks the provider to stop the batch; what it answered already is still billed and
    # comes back through ``results`` once it has ended. A batch that has ended is left.
    async def cancel(self, batch_id: str) -> ProviderBatch: ...

    async def aclose(self) -> None: ...
