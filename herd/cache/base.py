"""What a cache backend stores and the protocol it implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from herd.jsonvalue import JSON

COUNTERS = ("hits", "misses", "computed", "waited", "stale", "early_refresh", "errors")


@dataclass(frozen=True)
class Entry:
    value: JSON
    delta: float  # seconds the computation took (XFetch)
    created_at: float  # server time, epoch seconds
    expires_at: float | None  # server time; None: never
    now: float  # the server's clock at the read, so callers never use their own

    @property
    def fresh(self) -> bool:
        return self.expires_at is None or self.now < self.expires_at


class CacheStore(Protocol):
    """Two primitives and bookkeeping; the policy (singleflight, XFetch) lives in ExactCache."""

    name: str

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def get(self, namespace: str, key: str, *, stale_for: float = 0.0) -> Entry | None:
        """The entry, also when expired less than ``stale_for`` seconds ago."""
        ...

    async def put(
        self,
        namespace: str,
        key: str,
        value: JSON,
        *,
        delta: float,
        ttl: float | None,
        keep_stale: float = 0.0,
    ) -> None: ...
    async def delete(self, namespace: str, key: str) -> None: ...
    async def clear(self, namespace: str | None = None) -> int: ...
    async def count(self, amounts: dict[str, int], namespace: str) -> None: ...
    async def stats(self) -> dict[str, dict[str, int]]:
        """Counters and the number of entries, per namespace."""
        ...
