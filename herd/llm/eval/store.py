"""The evaluation store: documents, specs, batches, items and the cost ledger, in herd's
PostgreSQL. Every write to a ``herd_eval_*`` table goes through here (or the ledger
this module drives); the statements are named in queries.sql."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import asdict
from datetime import datetime
from typing import Any, TypeVar

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from herd.cache.retention import PURGE_EVERY, Periodic, in_batches
from herd.config import EVAL_TTL, LEDGER_TTL
from herd.db import postgres as pgdb
from herd.db.queries import named
from herd.errors import BatchNameTaken, BatchNotFound, Fatal, InvalidInput
from herd.llm.eval import ledger
from herd.llm.eval.money import as_float, money
from herd.llm.eval.pipeline import Pipeline, from_json
from herd.llm.eval.spec import EvalSpec

Q = {**ledger.Q, **named("herd.llm.eval", "pipeline.sql")}
# Why a batch's jobs wait: its budget is spent, the provider refused its key or model,
# or it was cancelled (for good).
PARK_REASONS = ("budget", "refused", "cancelled")
# Seconds a job's answer is kept for items stored after its end (herd_eval_job_answers):
# submit stores a batch's items just after it enqueues their jobs.
JOB_ANSWER_TTL = 3600.0
# Specs and pipelines a store keeps once read, of each (EvalStore.spec): a batch has a
# few specs, a pipeline one per stage.
KEPT = 256
T = TypeVar("T")


class _Kept(dict[str, T]):
    """Values read by the hash of their content, which never change: the oldest read
    is dropped past KEPT."""

    def keep(self, key: str, value: T) -> T:
        if len(self) >= KEPT:
            self.pop(next(iter(self)))
        self[key] = value
        return value


def translate_errors(url: str) -> AbstractContextManager[None]:
    return pgdb.translate_errors(url, store="the evaluation store")


class EvalStore:
    """Documents, specs, batch items and the cost ledger, in herd's PostgreSQL."""

    def __init__(
        self,
        url: str,
        *,
        ledger_ttl: float = LEDGER_TTL,
        eval_ttl: float = EVAL_TTL,
        purge_every: float = PURGE_EVERY,
    ) -> None:
        """``ledger_ttl``: seconds an itemised ledger row is kept (the summary keeps its
        totals); ``eval_ttl``: seconds a finished item is kept, and documents and specs
        no queued item needs after their last submission. 0 keeps them.
        ``purge_every``: seconds between the purges writes start (0: only ``purge()``)."""
        self.url = url
        self.ledger_ttl, self.eval_ttl = float(ledger_ttl), float(eval_ttl)
        self.pool = pgdb.SharedPool(
            url, max_size=4, store="the evaluation store", unchecked_if_fresh=True
        )
        self._purges = Periodic(self.purge, "evaluations", purge_every)
        self._specs: _Kept[EvalSpec] = _Kept()
        self._pipelines: _Kept[Pipeline] = _Kept()

    async def open(self) -> None:
        await self.pool.open("herd.llm.sql")

    async def close(self) -> None:
        await self._purges.stop()
        await self.pool.close()

    async def execute(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """One statement (a name of queries.sql, or SQL for reads of tests and tools)."""
        with translate_errors(self.url):
            async with self.pool.connection() as conn:
                cur = await conn.execute(Q.get(query, query), params)
                return await cur.fetchall() if cur.description else []

    @staticmethod
    async def on(conn: AsyncConnection[Any], name: str, **params: Any) -> list[tuple[Any, ...]]:
        """A named statement in the caller's transaction (one fenced by a job's lease)."""
        cur = await conn.execute(Q[name], params)
        return await cur.fetchall() if cur.description else []

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        with translate_errors(self.url):
            async with self.pool.connection() as conn, conn.transaction():
                yield conn

    # -- what a submission stores ------------------------------------------------------

    async def put_documents(self, docs: dict[str, str]) -> None:
        self._purges.due()
        if docs:
            await self.execute(
                "put_documents", {"hashes": list(docs), "texts": list(docs.values())}
            )

    async def put_spec(self, spec: EvalSpec) -> None:
        await self.execute("put_spec", {"hash": spec.hash, "spec": Jsonb(asdict(spec))})

    async def put_items(self, batch: str, spec: str, rows: list[tuple[str, str, int, str]]) -> None:
        """The batch's items: (path, key, job id, document hash) each. Under the join
        lock of their jobs: an item whose job ended before it was stored (deduplicated
        onto a job as it finished, or a job a worker ran at once) takes its answer here,
        so no read has to repair it."""
        if rows:
            paths, keys, jobs, docs = (list(c) for c in zip(*rows, strict=True))
            async with self.transaction() as conn:
                await conn.execute(Q["join_lock"], {"jobs": jobs})
                await conn.execute(
                    Q["put_items"],
                    {"batch": batch, "spec": spec, "paths": paths, "keys": keys,
                     "jobs": jobs, "docs": docs},
                )  # fmt: skip
                await conn.execute(Q["put_batch_specs"], {"batch": batch, "spec": spec})

    async def put_batch(
        self,
        batch: str,
        *,
        budget: float | None,
        limits: dict[str, int] | None,
        owner: str = "local",
    ) -> None:
        """Create the batch's row, owned by ``owner``, or update what is given. A batch
        of another owner is refused (BatchNameTaken), changed in nothing: a submission
        must not reset another caller's budget or limits. A cancelled batch takes no
        more documents: its jobs would make no call."""
        rows = await self.execute(
            "put_batch",
            {"b": batch, "budget": money(budget), "set": budget is not None,
             "limits": Jsonb(limits) if limits is not None else None, "owner": owner},
        )  # fmt: skip
        if not rows:
            raise BatchNameTaken(
                f"batch: {batch!r} is in use by another submitter; submit under another name"
            )
        if rows[0][0] == "cancelled":
            raise InvalidInput(
                f"batch: {batch!r} was cancelled; submit under another name", field="batch"
            )

    # -- what a job reads ----------------------------------------------------------------

    async def document(self, doc_hash: str) -> str:
        rows = await self.execute("document", {"hash": doc_hash})
        if not rows:
            raise Fatal(f"document {doc_hash[:12]}… is not stored (was the database reset?)")
        return str(rows[0][0])

    async def spec(self, spec_hash: str) -> EvalSpec:
        """The stored spec of that hash. A hash names its content, so a spec read once is
        kept (SPECS_KEPT): every piece of a batch asks for the same few, and making one
        checks its schema against the meta-schema."""
        found = self._specs.get(spec_hash)
        if found is None:
            rows = await self.execute("spec", {"hash": spec_hash})
            if not rows:
                raise Fatal(f"evaluation spec {spec_hash[:12]}… is not stored")
            try:
                found = self._specs.keep(spec_hash, EvalSpec(**rows[0][0]))
            except InvalidInput as exc:  # stored before such specs were refused
                raise Fatal(f"evaluation spec {spec_hash[:12]}… is refused: {exc}") from None
        return found

    async def pipeline(self, pipe_hash: str) -> Pipeline:
        """The stored pipeline of that hash, kept once read as a spec is (every piece's
        run reads its pipeline)."""
        found = self._pipelines.get(pipe_hash)
        if found is None:
            rows = await self.execute("pipeline", {"hash": pipe_hash})
            if not rows:
                raise Fatal(f"pipeline {pipe_hash[:12]}… is not stored")
            try:
                found = self._pipelines.keep(pipe_hash, from_json(rows[0][0]))
            except InvalidInput as exc:
                raise Fatal(f"pipeline {pipe_hash[:12]}… is refused: {exc}") from None
        return found

    async def batch(self, batch: str) -> dict[str, Any] | None:
        """Budget, spent, reserved, parked (and why) and limits of a batch; None: it has
        no row."""
        rows = await self.execute("batch", {"b": batch})
        if not rows:
            return None
        budget, spent, reserved, parked, limits, reason, created = rows[0]
        return {"budget": as_float(budget), "spent": as_float(spent),
                "reserved": as_float(reserved), "parked": parked, "limits": limits,
                "parked_reason": reason, "created_at": created}  # fmt: skip

    async def owner(self, batch: str) -> str | None:
        """Who made the batch ('local', or 'token:<hash>'); None: there is no such batch."""
        rows = await self.execute("batch_owner", {"b": batch})
        if rows:
            return str(rows[0][0])
        # Items with no batch row: submitted before batches had rows, locally.
        return "local" if await self.exists(batch) else None

    async def put_fallbacks(self, batch: str, fallbacks: list[str]) -> None:
        await self.execute("put_fallbacks", {"b": batch, "fallbacks": Jsonb(fallbacks)})

    async def fallbacks(self, batch: str | None) -> list[str]:
        """The batch's fallbacks, as a pipeline's calls read them (provider:model)."""
        if batch is None:
            return []
        rows = await self.execute("batch_fallbacks", {"b": batch})
        return [str(f) for f in rows[0][0]] if rows else []

    async def exists(self, batch: str) -> bool:
        rows = await self.execute("batch_exists", {"b": batch})
        return bool(rows[0][0])

    # -- parking, budgets, cancelling ------------------------------------------------

    async def park(self, batch: str, why: str = "budget", reason: str | None = None) -> list[int]:
        """Mark the batch parked (``why``: budget or refused, ``reason`` in the
        provider's words) and its waiting items parked; returns their jobs (the caller
        moves them out of reach)."""
        assert why in PARK_REASONS
        async with self.transaction() as conn:
            await conn.execute(Q["park"], {"b": batch, "why": why, "reason": reason})
            cur = await conn.execute(Q["park_items"], {"b": batch})
            return sorted({job_id for (job_id,) in await cur.fetchall()})

    async def resume(self, batch: str, why: tuple[str, ...] = ("refused", "budget")) -> list[int]:
        """Unpark a batch parked for one of ``why``: its items queued again; returns their
        jobs (the caller brings them forward). BatchNotFound if there is no such batch."""
        async with self.transaction() as conn:
            if not await self._ensure_row(conn, batch):
                raise BatchNotFound(f"no batch named {batch!r}")
            cur = await conn.execute(Q["unpark"], {"b": batch, "why": list(why)})
            if await cur.fetchone() is None:
                return []
            cur = await conn.execute(Q["unpark_items"], {"b": batch})
            return sorted({job_id for (job_id,) in await cur.fetchall()})

    async def _ensure_row(self, conn: AsyncConnection[Any], batch: str) -> bool:
        """Whether the batch exists; a batch submitted before batches had rows gets one."""
        cur = await conn.execute(Q["batch_exists"], {"b": batch})
        if not (await cur.fetchone() or (False,))[0]:
            return False
        await conn.execute(Q["legacy_batch"], {"b": batch})
        return True

    async def set_budget(
        self, batch: str, budget: float | None
    ) -> tuple[dict[str, Any], list[int]]:
        """Set a batch's budget; if it is parked for its budget and there is room now,
        unpark it. Returns the batch and the jobs to bring back."""
        exact = money(budget)
        async with self.transaction() as conn:
            if not await self._ensure_row(conn, batch):
                raise BatchNotFound(f"no batch named {batch!r}")
            cur = await conn.execute(Q["set_budget"], {"b": batch, "budget": exact})
            row = await cur.fetchone()
            assert row is not None
            spent, reserved, parked = row
            ids: list[int] = []
            if parked == "budget" and (exact is None or spent + reserved < exact):
                await conn.execute(Q["unpark"], {"b": batch, "why": ["budget"]})
                cur = await conn.execute(Q["unpark_items"], {"b": batch})
                ids = sorted({job_id for (job_id,) in await cur.fetchall()})
        found = await self.batch(batch)
        assert found is not None
        return found, ids

    async def cancel(
        self, batch: str
    ) -> tuple[list[int], list[tuple[str, str, str | None, str | None]]]:
        """Cancel a batch for good: its waiting items become 'cancelled'. Returns their
        jobs (the caller brings them forward, so they end now instead of waiting out a
        park) and the batch's provider batches not yet done: (handle, spec, provider
        batch id, None while being submitted, the pool key's variable or None)."""
        async with self.transaction() as conn:
            if not await self._ensure_row(conn, batch):
                raise BatchNotFound(f"no batch named {batch!r}")
            await conn.execute(Q["cancel_batch"], {"b": batch})
            cur = await conn.execute(Q["cancel_items"], {"b": batch})
            jobs = sorted({job_id for (job_id,) in await cur.fetchall()})
            cur = await conn.execute(Q["open_provider_batches"], {"b": batch})
            return jobs, [(h, s, b, v) for h, s, b, v in await cur.fetchall()]

    async def cancelled_items(self, batch: str) -> int:
        return int((await self.execute("items_cancelled", {"b": batch}))[0][0])

    async def cancel_job_items(self, job_id: int) -> None:
        await self.execute("cancel_job_items", {"job": job_id})

    # -- failures: items whose job died or is gone ---------------------------------

    async def job_running(self, job_id: int) -> None:
        """The job runs (again): its items are not dead."""
        await self.execute("job_running", {"job": job_id})

    async def job_failed(self, job_id: int, key: str) -> None:
        """The job's last attempt failed: its waiting items of ``key`` are dead."""
        await self.execute("job_failed", {"job": job_id, "key": key})

    async def record_failures(self, rows: list[tuple[str, str, int, str]]) -> None:
        """(batch, path, job id, 'dead' or 'lost') of items found waiting on a job that
        is dead or gone."""
        if rows:
            batches, paths, jobs, kinds = (list(c) for c in zip(*rows, strict=True))
            await self.execute(
                "record_failures",
                {"batches": batches, "paths": paths, "jobs": jobs, "kinds": kinds},
            )

    # -- the ledger ------------------------------------------------------------------

    async def record(self, **row: Any) -> None:
        """One closed row of the ledger (batch, job_id, key, kind, model, provider, and
        tokens and cost where it has them), and its summaries, in one transaction."""
        self._purges.due()
        full = {"batch": row.get("batch"), "job": row.get("job_id"), "key": row["key"],
                "kind": row["kind"], "model": row.get("model"), "provider": row.get("provider"),
                "i": row.get("input_tokens", 0), "o": row.get("output_tokens", 0),
                "cost": row.get("cost"), "ci": row.get("cached_input_tokens", 0),
                "cw": row.get("cache_write_tokens", 0),
                "ps": row.get("provider_saved")}  # fmt: skip
        with translate_errors(self.url):
            async with self.pool.connection() as conn:
                await ledger.record(conn, full)

    async def cut_short(self, job_id: int) -> int:
        """Close the calls a previous run of this job left open: it died mid-call."""
        with translate_errors(self.url):
            async with self.pool.connection() as conn:
                return await ledger.cut_short(conn, job_id=job_id)

    async def close_call(self, call_id: int, kind: str | None, **usage: Any) -> bool:
        self._purges.due()
        with translate_errors(self.url):
            async with self.pool.connection() as conn:
                return await ledger.close(conn, call_id, kind, **usage)

    async def totals(self, batch: str | None = None) -> dict[str, dict[str, Any]]:
        """The ledger's summary per kind: of one batch, or of all time (None)."""
        if batch is None:
            rows = await self.execute("ledger_totals")
        else:
            rows = await self.execute("ledger_batch_totals", {"b": batch})
        out = {}
        for kind, n, i, o, c, s, ci, cw, ps, *unpriced in rows:
            out[kind] = {
                "n": int(n),
                "input_tokens": int(i),
                "output_tokens": int(o),
                "cost": as_float(c),
                "saved": as_float(s),
                "cached_input_tokens": int(ci),
                "cache_write_tokens": int(cw),
                "provider_cache_saved": as_float(ps),
                # Of all time only: paid calls without a price (a batch's are by model).
                **({"unpriced": int(unpriced[0])} if unpriced else {}),
            }  # fmt: skip
        return out

    # -- reading a batch back ----------------------------------------------------------

    async def list_batches(
        self, *, limit: int, before: tuple[datetime, str] | None = None
    ) -> list[tuple[Any, ...]]:
        """A page of batches, newest first: (batch, created_at, budget, spent, parked,
        parked_reason); ``before``: the (created_at, batch) of the last row seen."""
        rows = await self.execute(
            "list_batches",
            {"before": before[0] if before else None, "after": before[1] if before else None,
             "limit": limit},
        )  # fmt: skip
        return [(b, c, as_float(bu), as_float(s), p, r) for b, c, bu, s, p, r in rows]

    async def item_counts(self, batches: list[str]) -> dict[str, tuple[int, int, int, int]]:
        """(documents, done, parked, cancelled) of each batch."""
        rows = await self.execute("batch_counts", {"batches": batches})
        return {b: (int(n), int(d), int(p), int(c)) for b, n, d, p, c in rows}

    async def dashboard_batches(self, limit: int) -> list[tuple[str, datetime]]:
        """(batch, updated_at) of the ``limit`` newest batches and of older ones still
        parked on their budget or a refusal, newest first."""
        rows = await self.execute("dashboard_batches", {"limit": limit})
        return [(b, u) for b, u in rows]

    async def model_costs(self, batch: str) -> list[tuple[Any, ...]]:
        """A batch's closed paid calls by model: (model, calls, input tokens, output
        tokens, cost, calls without a price, cost of those cut off mid-call), from the
        ledger's rows."""
        rows = await self.execute("batch_model_costs", {"b": batch})
        return [(m, int(n), int(i or 0), int(o or 0), as_float(c), int(u), as_float(e))
                for m, n, i, o, c, u, e in rows]  # fmt: skip

    async def results(self, batch: str, *, after: str | None, limit: int) -> list[tuple[Any, ...]]:
        """A page of a batch's items by path: (path, status, source, result, job id, key,
        finished at, model, provider)."""
        return await self.execute("results", {"b": batch, "after": after, "limit": limit})

    async def key_calls(self, batch: str, keys: list[str]) -> dict[str, tuple[Any, ...]]:
        """Per key, what this batch's calls of it cost: (input, cached input, output
        tokens, cost, any unpriced, first at, last at, calls)."""
        rows = await self.execute("key_calls", {"b": batch, "keys": keys})
        return {k: (int(i), int(ci), int(o), c, unpriced, a, z, int(n))
                for k, i, ci, o, c, unpriced, a, z, n in rows}  # fmt: skip

    # -- retention ---------------------------------------------------------------------

    async def _delete(self, name: str, keep: float, limit: int) -> int:
        with translate_errors(self.url):
            async with self.pool.connection() as conn:
                cur = await conn.execute(Q[name], {"keep": keep, "limit": limit})
                return cur.rowcount

    async def purge(self, *, ledger_ttl: float | None = None, eval_ttl: float | None = None) -> int:
        """Delete what is past its retention (default: the store's settings), in bounded
        batches oldest first; returns how many rows went. A document or spec that a
        queued item's job will read stays, whatever its age."""
        keep_ledger = self.ledger_ttl if ledger_ttl is None else ledger_ttl
        keep_eval = self.eval_ttl if eval_ttl is None else eval_ttl
        steps: list[tuple[str, float]] = []
        if keep_ledger:
            steps += [("purge_ledger", keep_ledger), ("purge_keys", keep_ledger)]
        # A job's answer waits for items stored just after its end: minutes at most.
        steps.append(("purge_job_answers", JOB_ANSWER_TTL))
        steps.append(("purge_failures", 0.0))
        if keep_eval:
            steps += [("purge_items", keep_eval), ("purge_batch_totals", keep_eval)]
            steps += [("purge_batch_specs", keep_eval), ("purge_batch_keys", keep_eval)]
            # A pipeline's pieces and fan-in go with their document's item.
            steps += [("purge_pieces", keep_eval), ("purge_fanin", keep_eval),
                      ("purge_stage_counts", keep_eval), ("purge_stage_costs", keep_eval),
                      ("purge_pipelines", keep_eval)]  # fmt: skip
            legacy = await self.execute("legacy_queued")
            if not legacy[0][0]:
                steps += [("purge_documents", keep_eval), ("purge_specs", keep_eval)]
            steps.append(("purge_provider_batches", keep_eval))
            steps.append(("purge_batches", keep_eval))
        removed = 0
        if keep_ledger:  # calls open that long: their workers died, nobody took over
            while await self._cut_short_old(keep_ledger, 1000) == 1000:
                pass
        for name, keep in steps:
            removed += await in_batches(functools.partial(self._delete, name, keep))
        return removed

    async def _cut_short_old(self, keep: float, limit: int) -> int:
        with translate_errors(self.url):
            async with self.pool.connection() as conn:
                return await ledger.cut_short(conn, keep=keep, limit=limit)
