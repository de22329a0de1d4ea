"""What the stores outside PostgreSQL share: sync clients off the event loop, names."""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from herd.rag.errors import generation_gone
from herd.rag.vectors.base import Space

T = TypeVar("T")
SCROLL = 1_000  # points per page when a store lists a space


def alias(collection: str) -> str:
    """A name Qdrant and Milvus both accept, readable, and unique per collection."""
    readable = re.sub(r"[^A-Za-z0-9_]", "_", collection)[:48]
    return f"herd_{readable}_{hashlib.sha256(collection.encode()).hexdigest()[:8]}"


class Threaded:
    """Sync clients called off the event loop, one call at a time (local engines are
    not safe to share between threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        def locked() -> T:
            with self._lock:
                return fn(*args, **kwargs)

        return await asyncio.to_thread(locked)


def gone(space: Space) -> Exception:
    return generation_gone(space.id, space.collection)
