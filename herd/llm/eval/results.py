"""A batch's results read back: one row per document, answered or not, with what its
answer cost, as JSON lines, CSV (a column per top-level answer field) or Parquet."""

from __future__ import annotations

import csv
import json
from collections.abc import AsyncIterator
from decimal import Decimal
from typing import IO, Any

from herd.app import App
from herd.errors import BatchNotFound
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.stageview import doc_calls
from herd.llm.eval.status import GONE, jobs_of

FIXED = ("path", "status", "model", "source", "input_tokens", "cached_input_tokens",
         "output_tokens", "cost", "seconds", "error")  # fmt: skip
PAGE = 500
# The job of a pipeline's document: none of its own (its stages' jobs answer it).
PIPELINE = object()


async def rows(
    app: App, batch: str, *, after: str | None = None, limit: int | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The batch's documents by path (from after ``after``; at most ``limit``): path,
    status (done, dead, queued, running, parked, cancelled), model, source (call,
    cache, dedup, batch), tokens, cost (None: unpriced or not answered), seconds, error,
    and the answer's output."""
    rt = await EvalRuntime.of(app)
    if not await rt.store.exists(batch):
        raise BatchNotFound(f"no batch named {batch!r}; `herd eval list` shows them")
    left = limit
    while left is None or left > 0:
        page = await rt.store.results(batch, after=after, limit=min(PAGE, left or PAGE))
        if not page:
            return
        waiting = sorted({r[4] for r in page if r[1] in ("queued", "parked")})
        jobs = {j.id: j for j in await jobs_of(app, waiting)}
        calls = await rt.store.key_calls(batch, sorted({r[5] for r in page}))
        staged = await doc_calls(rt, batch, [r[0] for r in page if r[4] == 0])
        for path, status, source, result, job_id, key, at, model, _provider in page:
            if job_id == 0:  # a pipeline's document: its stages' jobs answer it
                yield _row(path, status, source, result, PIPELINE, staged.get(path), model, at)
                continue
            yield _row(path, status, source, result, jobs.get(job_id), calls.get(key), model, at)
        after = page[-1][0]
        if left is not None:
            left -= len(page)


def _row(path: str, status: str, source: str | None, result: Any, job: Any,
         calls: tuple[Any, ...] | None, model: str | None,
         finished: Any = None) -> dict[str, Any]:  # fmt: skip
    error = None
    if status == "failed":  # a pipeline's document: the stage and piece that failed it
        status, error = "dead", (result or {}).get("error")
    elif job is PIPELINE:
        pass
    elif status in ("queued", "parked") and job is not None:
        if job.status == "dead":
            status, error = "dead", job.last_error or job.dead_reason
        elif job.status == "processing":
            status = "running"
    elif status in ("queued", "parked") and job is None:
        status, error = "lost", GONE
    answer = result if isinstance(result, dict) else {}
    # Who answered: a call of this batch, the exact cache, a document deduplicated onto
    # another's job, or a provider batch.
    shown = {"computed": "call", "hit": "cache", "waited": "cache", "stale": "cache",
             "early": "call", "batch": "batch"}.get(source or "", source)  # fmt: skip
    i = ci = o = 0
    cost: Decimal | None = None
    seconds = None
    if calls is not None and shown in ("call", "batch", "pipeline"):
        i, ci, o, cost, unpriced, first, _last, _n = calls
        cost = None if unpriced else cost
        # From its first call's request to its answer landing: what the document took.
        seconds = round((finished - first).total_seconds(), 3) if first and finished else None
    elif status == "done" and shown == "call":
        shown = "dedup"  # answered by another batch's (or document's) call
    return {"path": path, "status": status, "model": answer.get("model") or model,
            "source": shown if status == "done" else None, "input_tokens": i,
            "cached_input_tokens": ci, "output_tokens": o,
            "cost": None if cost is None else float(cost), "seconds": seconds, "error": error,
            "output": answer.get("output")}  # fmt: skip


def fields_of(schema: dict[str, Any] | None) -> list[str]:
    """The schema's top-level fields: a column each."""
    props = (schema or {}).get("properties")
    return list(props) if isinstance(props, dict) else []


def write_jsonl(out: IO[str], row: dict[str, Any]) -> None:
    out.write(json.dumps(row, ensure_ascii=False) + "\n")


def csv_row(row: dict[str, Any], fields: list[str]) -> list[Any]:
    """A row for a spreadsheet: the fixed columns, then one per answer field (nested
    values as JSON), or the whole answer as JSON when the schema names no fields."""
    out = [row[c] if row[c] is not None else "" for c in FIXED]
    value = row["output"]
    if fields:
        for f in fields:
            v = value.get(f) if isinstance(value, dict) else None
            out.append("" if v is None else v if isinstance(v, str | int | float) else
                       json.dumps(v, ensure_ascii=False))  # fmt: skip
    else:
        out.append("" if value is None else json.dumps(value, ensure_ascii=False))
    return out


def csv_header(fields: list[str]) -> list[str]:
    return [*FIXED, *(fields or ["output"])]


def write_csv_header(out: IO[str], fields: list[str]) -> Any:
    writer = csv.writer(out)
    writer.writerow(csv_header(fields))
    return writer


def write_parquet(path: str, table: list[dict[str, Any]], fields: list[str]) -> None:
    """The rows as one Parquet file (pyarrow, the ``parquet`` extra): the fixed columns
    typed, answer fields as columns of their own (nested values as JSON text)."""
    import pyarrow as pa  # the parquet extra: imported only for --format parquet
    import pyarrow.parquet as pq

    columns: dict[str, list[Any]] = {c: [r[c] for r in table] for c in FIXED}
    for f in fields or ["output"]:
        columns[f] = [_cell(r["output"].get(f) if fields and isinstance(r["output"], dict)
                            else r["output"]) for r in table]  # fmt: skip
    pq.write_table(pa.table(columns), path)


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, str | bool | int | float):
        return value if not isinstance(value, bool | int | float) else json.dumps(value)
    return json.dumps(value, ensure_ascii=False)
