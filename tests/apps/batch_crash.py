"""The worker app of the Batch API's kill-at-each-step test: herd's built-in tasks (which
`herd worker` adds), with the providers' Batch API clients replaced (through the
provider registry) by ones that die, as SIGKILL would kill it, at the step
HERD_TEST_CRASH_AT names: after_record_handle (before anything reaches the provider),
after_upload, after_create.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from herd import App
from herd.llm.providers import registry
from herd.llm.providers.anthropic_batch import AnthropicBatch
from herd.llm.providers.batch import Request
from herd.llm.providers.openai_batch import OpenAIBatch

CRASH_POINTS = ("after_record_handle", "after_upload", "after_create")
AT = os.environ.get("HERD_TEST_CRASH_AT")


def _die_at(step: str) -> None:
    if step == AT:
        os._exit(137)


class Crashing:
    """Put before a Batch API client class: dies at the step named."""

    async def find(self, handle: str) -> Any:
        _die_at("after_record_handle")
        return await super().find(handle)

    async def upload(self, handle: str, requests: list[Request]) -> str:
        _die_at("after_record_handle")
        found = await super().upload(handle, requests)
        _die_at("after_upload")
        return found

    async def create(self, handle: str, file_id: str) -> str:
        _die_at("after_record_handle")
        found = await super().create(handle, file_id)
        _die_at("after_create")
        return found


class CrashingOpenAI(Crashing, OpenAIBatch):
    pass


class CrashingAnthropic(Crashing, AnthropicBatch):
    pass


registry.register(
    dataclasses.replace(
        registry.kind("openai"), batch=lambda model, key: CrashingOpenAI(model=model, api_key=key)
    )
)
registry.register(
    dataclasses.replace(
        registry.kind("anthropic"),
        batch=lambda model, key: CrashingAnthropic(model=model, api_key=key),
    )
)
app = App()  # `herd worker` adds the built-in tasks
