"""The semantic cache's figures: counters and two histograms, as integers a backend can add.

Every figure is a counter (a Prometheus collector can expose them as they are):
``c:<name>`` for events, ``sim:<le>`` / ``lat:<le>`` for histogram buckets (not
cumulative here; ``Stats.histogram`` makes them cumulative), and ``sim:sum`` in
millionths and ``lat:sum`` in microseconds. A process adds to its own buffer on
every lookup and flushes it to the backend at most once a second, so the hot path
costs no extra round trip.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any

SIMILARITY_BUCKETS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.925, 0.95, 0.975, 0.99, 1.0)
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
COUNTERS = (
    "lookups",
    "hits",
    "misses",
    "guard_rejections",  # a candidate above the threshold refused by the near-miss guards
    "stores",
    "too_large",  # an answer past max_entry_bytes: returned, not stored
    "evictions",
    "computed",
    "waited",  # lock waits: a caller waited for another's computation
    "stale",
    "early_refresh",
    "errors",
    "rechecks",  # bounded mode: a hit computed anyway, to check it
    "verdicts_right",  # bounded mode: verdicts on hits served or considered
    "verdicts_wrong",
)


@dataclass
class Buffer:
    """Figures not yet flushed to the backend; safe to add to from any thread."""

    amounts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.amounts[f"c:{name}"] = self.amounts.get(f"c:{name}", 0) + n

    def add(self, name: str, n: int = 1) -> None:
        """A raw figure, such as a pooled verdict counter (herd.semantic.bounded)."""
        with self.lock:
            self.amounts[name] = self.amounts.get(name, 0) + n

    def observe(self, prefix: str, buckets: tuple[float, ...], value: float, scale: int) -> None:
        i = bisect.bisect_left(buckets, value)
        le = f"{buckets[i]:g}" if i < len(buckets) else "+Inf"
        with self.lock:
            self.amounts[f"{prefix}:{le}"] = self.amounts.get(f"{prefix}:{le}", 0) + 1
            key = f"{prefix}:sum"
            self.amounts[key] = self.amounts.get(key, 0) + round(value * scale)

    def take(self) -> dict[str, int]:
        with self.lock:
            out, self.amounts = self.amounts, {}
        return out


def histogram(
    raw: dict[str, int], prefix: str, buckets: tuple[float, ...], scale: int
) -> dict[str, Any]:
    """Cumulative buckets (Prometheus ``le``), count and sum, from the stored counters."""
    out: dict[str, int] = {}
    total = 0
    for le in [*(f"{b:g}" for b in buckets), "+Inf"]:
        total += raw.get(f"{prefix}:{le}", 0)
        out[le] = total
    return {"buckets": out, "count": total, "sum": raw.get(f"{prefix}:sum", 0) / scale}


def summarize(raw: dict[str, int]) -> dict[str, Any]:
    """A cache name's figures as plain data: counters, derived rates, histograms."""
    counters = {name: raw.get(f"c:{name}", 0) for name in COUNTERS}
    answered = counters["hits"] + counters["misses"]
    return {
        "entries": raw.get("entries", 0),
        **counters,
        "hit_rate": counters["hits"] / answered if answered else 0.0,
        "lock_waits": counters["waited"],
        # Callers that would have recomputed without singleflight or a stale value.
        "stampedes_suppressed": counters["waited"] + counters["stale"],
        "nearest_similarity": histogram(raw, "sim", SIMILARITY_BUCKETS, 1_000_000),
        "lookup_seconds": histogram(raw, "lat", LATENCY_BUCKETS, 1_000_000),
    }
