"""What a chaos run did (its faults, workers, drain, evaluation batch): written by the
harness, read by the checker, which therefore needs nothing else of the harness."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunRecord:
    """What the harness did, for the checker and the report."""

    config: dict[str, Any]
    started: float = 0.0
    ended: float = 0.0
    job_ids: dict[int, str] = field(default_factory=dict)  # id -> "work" | "poison"
    faults: list[dict[str, Any]] = field(default_factory=list)
    worker_pids: list[int] = field(default_factory=list)
    unexpected_exits: list[dict[str, Any]] = field(default_factory=list)
    drain_exit_codes: dict[int, int | None] = field(default_factory=dict)
    drained: bool = False
    # Leases held when the faults stopped: {job, pid, alive, t} (checked against the deaths).
    lease_snapshot: list[dict[str, Any]] = field(default_factory=list)
    drain_seconds: float = 0.0
    eval_batch: str | None = None
    eval_documents: int = 0  # documents submitted (items of the batch)
    eval_job_ids: dict[int, str] = field(default_factory=dict)  # id -> canonical key
    eval_waves: list[dict[str, Any]] = field(default_factory=list)  # {t, documents}
    pipeline_batch: str | None = None
    pipeline_documents: int = 0
