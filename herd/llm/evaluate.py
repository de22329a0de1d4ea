"""LLM evaluation jobs: submit documents, evaluate each once, account for every token.

A job carries hashes only (document, spec, canonical key); the texts live in
PostgreSQL. The task looks the canonical key up in the exact cache; on a miss
it takes the key's singleflight lock and calls the provider, validates the
answer against the schema (one repair attempt that shows the model its error),
and stores it. Every call made or avoided is a row of the cost ledger.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import math
import os
import random
import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from herd import telemetry
from herd.app import App
from herd.cache import ExactCache, canonical_key
from herd.cache.keys import normalize_document
from herd.cache.retention import PURGE_EVERY, Periodic, in_batches
from herd.cache.stores import cache_stores
from herd.config import EVAL_MAX_TOKENS, EVAL_TTL, LEDGER_TTL, Settings
from herd.db import postgres as pgdb
from herd.errors import BatchNotFound, Fatal, InvalidInput, Snooze
from herd.jsonvalue import JSON, canonical, check, check_text
from herd.limits import CapacityTimeout, Limit, Limiter, LimitsFile, for_broker, hold, scope_name
from herd.limits import load as load_limits
from herd.limits.tokens import estimate_input, estimate_output, requested_max
from herd.llm import ledger
from herd.llm.completion import Completion, Usage
from herd.llm.documents import DocumentError, find_documents, read_document
from herd.llm.errors import ProviderError, ProviderResponseInvalid, ProviderTimeout, RateLimited
from herd.llm.params import check_params
from herd.llm.pricing import PriceTable
from herd.llm.providers import Anthropic, OpenAICompatible, Provider, RetryPolicy, promptcache
from herd.llm.providers.anthropic import DEFAULT_MAX_TOKENS
from herd.queue.base import EnqueueResult, Job
from herd.tasks import JobContext

TASK = "herd.eval"
QUEUE = "eval"

# A parked batch's pending jobs are moved this far out of reach; raising the budget
# brings them back at once (EvalStore.set_budget).
PARK_DELAY = 10 * 365 * 86400.0
# The job that finds the budget spent looks again this often: a budget raised while
# it was handing itself back would otherwise miss it (it was running, not pending).
PARK_RECHECK = 60.0
LIMIT_NAMES = ("rpm", "tpm", "max_concurrent")
# A batch's stored limits are read again after this long: a limit changed for a batch
# reaches every worker within it.
BATCH_LIMITS_TTL = 5.0
# A 429 that says nothing of when to come back pauses its limit this long.
DEFAULT_PAUSE = 1.0
# 429s in a row one call takes before its job is handed back (no attempt counted).
MAX_RATE_LIMITED = 5
# A concurrency slot of a worker that died frees itself after this long (a live one is
# renewed every third of it).
SLOT_HOLD = 60.0


# The Batch API's jobs (herd.llm.batchapi) serve many items and answer none themselves.
BATCH_API_TASKS = ("herd.eval.batch_submit", "herd.eval.batch_poll")


class OverBudget(Exception):
    """The next call would pass the batch's budget, or the batch is parked."""


class BatchCancelled(Exception):
    """The batch was cancelled (``herd eval cancel``): no call is made for it any more."""


def check_budget(budget: float | None, field: str = "budget") -> float | None:
    """A budget in USD: a finite number >= 0, or None (no budget)."""
    if budget is None:
        return None
    if (
        isinstance(budget, bool)
        or not isinstance(budget, int | float)
        or not (math.isfinite(budget) and budget >= 0)
    ):
        raise InvalidInput(
            f"{field} must be a finite number of USD >= 0, not {budget!r}", field=field
        )
    return float(budget)


def check_limits(limits: dict[str, Any] | None) -> dict[str, int] | None:
    """A batch's limits: rpm, tpm and max_concurrent, each a positive integer."""
    if limits is None:
        return None
    out: dict[str, int] = {}
    for name, value in limits.items():
        if name not in LIMIT_NAMES:
            raise InvalidInput(
                f"limits.{name} is not a limit: use {', '.join(LIMIT_NAMES)}", field=name
            )
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(f"{name} must be a positive integer, not {value!r}", field=name)
        out[name] = value
    return out


def reservation_tokens(
    spec: EvalSpec, user: str, *, default_max: int = EVAL_MAX_TOKENS
) -> tuple[int, int]:
    """The worst case of one call: (estimated input tokens, the most output tokens
    it may generate). ``default_max``: the setting HERD_EVAL_MAX_TOKENS, the bound
    when the params name none. The input estimate (herd.limits.tokens) never counts
    fewer tokens than the provider, so the reservation errs on the side of the budget."""
    estimate = estimate_input(spec.provider, spec.model, spec.system, user)
    asked = requested_max(spec.params)
    if asked is not None:
        return estimate, asked
    if spec.provider == "anthropic":
        return estimate, min(DEFAULT_MAX_TOKENS, default_max)
    return estimate, default_max


@dataclass(frozen=True)
class EvalSpec:
    """Everything besides the document that determines the model's answer."""

    model: str
    system: str
    schema: dict[str, Any] | None = None
    provider: str = "openai"  # or "anthropic"
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Refused where a spec is made, so the Python API, the CLI and the HTTP API
        # refuse alike; the token bound needs the settings in force: check().
        check_params(self.params)

    def check(self, settings: Settings) -> None:
        """Refuse params asking for more tokens per call than ``HERD_EVAL_MAX_TOKENS``."""
        check_params(self.params, max_tokens=settings.eval_max_tokens)

    @property
    def hash(self) -> str:
        return hashlib.sha256(canonical(asdict(self)).encode()).hexdigest()

    def key(self, document: str) -> str:
        return canonical_key(
            model=f"{self.provider}:{self.model}",
            system=self.system,
            schema=self.schema,
            # Where the provider reads the prompt from does not change the answer.
            params={k: v for k, v in self.params.items() if k != promptcache.PARAM},
            document=document,
        )


@dataclass
class SubmitReport:
    batch: str
    queued: int = 0
    deduplicated: int = 0
    errors: list[str] = field(default_factory=list)
    job_ids: list[int] = field(default_factory=list)


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
        self.pool = pgdb.SharedPool(url, max_size=4, store="the evaluation store")
        self._purges = Periodic(self.purge, "evaluations", purge_every)

    async def open(self) -> None:
        await self.pool.open("herd.llm.sql")

    async def close(self) -> None:
        await self._purges.stop()
        await self.pool.close()

    async def execute(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with translate_errors(self.url):
            async with self.pool.connection() as conn:
                cur = await conn.execute(query, params)
                return await cur.fetchall() if cur.description else []

    async def put_documents(self, docs: dict[str, str]) -> None:
        # A submission refreshes created_at: retention counts from the last one.
        self._purges.due()
        if docs:
            await self.execute(
                "INSERT INTO herd_eval_documents (hash, text) SELECT * FROM unnest(%s::text[],"
                " %s::text[]) ON CONFLICT (hash) DO UPDATE SET created_at = now()",
                (list(docs), list(docs.values())),
            )

    async def put_spec(self, spec: EvalSpec) -> None:
        await self.execute(
            "INSERT INTO herd_eval_specs (hash, spec) VALUES (%s, %s)"
            " ON CONFLICT (hash) DO UPDATE SET created_at = now()",
            (spec.hash, Jsonb(asdict(spec))),
        )

    async def document(self, doc_hash: str) -> str:
        rows = await self.execute(
            "SELECT text FROM herd_eval_documents WHERE hash = %s", (doc_hash,)
        )
        if not rows:
            raise Fatal(f"document {doc_hash[:12]}… is not stored (was the database reset?)")
        return str(rows[0][0])

    async def spec(self, spec_hash: str) -> EvalSpec:
        rows = await self.execute("SELECT spec FROM herd_eval_specs WHERE hash = %s", (spec_hash,))
        if not rows:
            raise Fatal(f"evaluation spec {spec_hash[:12]}… is not stored")
        try:
            return EvalSpec(**rows[0][0])
        except InvalidInput as exc:  # stored before such params were refused
            raise Fatal(f"evaluation spec {spec_hash[:12]}… is refused: {exc}") from None

    async def record(
        self,
        *,
        batch: str | None,
        job_id: int | None,
        key: str,
        kind: str,
        model: str | None = None,
        provider: str | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost: float | None = None,
        cached_input_tokens: int = 0,
        cache_write_tokens: int = 0,
        provider_saved: float | None = None,
    ) -> None:
        """One row of the ledger, and its summary updated in the same transaction."""
        self._purges.due()
        row = {"batch": batch, "job": job_id, "key": key, "kind": kind, "model": model,
               "provider": provider, "i": input_tokens, "o": output_tokens,
               "cost": cost, "ci": cached_input_tokens, "cw": cache_write_tokens,
               "ps": provider_saved}  # fmt: skip
        with translate_errors(self.url):
            async with self.pool.connection() as conn:
                await ledger.record(conn, row)

    @asynccontextmanager
    async def transaction(self) -> Any:
        with translate_errors(self.url):
            async with self.pool.connection() as conn, conn.transaction():
                yield conn

    async def put_batch(
        self, batch: str, *, budget: float | None, limits: dict[str, int] | None
    ) -> None:
        """Create the batch's row, or update what is given (a later submit to the same
        batch leaves its budget and limits unless given). A cancelled batch takes no
        more documents: its jobs would make no call."""
        rows = await self.execute(
            "INSERT INTO herd_eval_batches AS b (batch, budget, limits)"
            " VALUES (%(b)s, %(budget)s, coalesce(%(limits)s, '{}'::jsonb))"
            " ON CONFLICT (batch) DO UPDATE SET"
            " budget = CASE WHEN %(set)s THEN excluded.budget ELSE b.budget END,"
            " limits = coalesce(%(limits)s, b.limits), updated_at = now()"
            " RETURNING parked",
            {
                "b": batch,
                "budget": budget,
                "set": budget is not None,
                "limits": Jsonb(limits) if limits is not None else None,
            },  # fmt: skip
        )
        if rows and rows[0][0] == "cancelled":
            raise InvalidInput(
                f"batch: {batch!r} was cancelled; submit under another name", field="batch"
            )

    async def cancel(self, batch: str) -> tuple[list[int], list[tuple[str, str, str | None]]]:
        """Cancel a batch for good: its waiting items become 'cancelled'. Returns their
        jobs (the caller brings them forward, so they end now instead of waiting out a
        park) and the batch's provider batches not yet done: (handle, spec, provider
        batch id, None while being submitted)."""
        async with self.transaction() as conn:
            cur = await conn.execute(
                "UPDATE herd_eval_batches SET parked = 'cancelled', parked_at = now(),"
                " updated_at = now() WHERE batch = %s RETURNING batch",
                (batch,),
            )
            if await cur.fetchone() is None:
                cur = await conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM herd_eval_items WHERE batch = %s)", (batch,)
                )
                if not (await cur.fetchone() or (False,))[0]:
                    raise BatchNotFound(f"no batch named {batch!r}")
                await conn.execute(  # a batch submitted before batches had rows
                    "INSERT INTO herd_eval_batches (batch, parked, parked_at)"
                    " VALUES (%s, 'cancelled', now())",
                    (batch,),
                )
            cur = await conn.execute(
                "UPDATE herd_eval_items SET status = 'cancelled', finished_at = now()"
                " WHERE batch = %s AND status IN ('queued', 'parked') RETURNING job_id",
                (batch,),
            )
            jobs = sorted({job_id for (job_id,) in await cur.fetchall()})
            cur = await conn.execute(
                "SELECT handle, spec, provider_batch_id FROM herd_eval_provider_batches"
                " WHERE batch = %s AND state <> 'done' ORDER BY handle",
                (batch,),
            )
            return jobs, [(h, s, b) for h, s, b in await cur.fetchall()]

    async def batch(self, batch: str) -> dict[str, Any] | None:
        """Budget, spent, reserved, parked and limits of a batch; None: it has no row."""
        rows = await self.execute(ledger.BATCH, {"b": batch})
        if not rows:
            return None
        budget, spent, reserved, parked, limits = rows[0]
        return {"budget": budget, "spent": spent, "reserved": reserved, "parked": parked,
                "limits": limits}  # fmt: skip

    async def park(self, batch: str) -> list[int]:
        """Mark the batch parked for its budget and its waiting items parked; returns
        their jobs (the caller moves them out of reach)."""
        async with self.transaction() as conn:
            await conn.execute(
                "UPDATE herd_eval_batches SET parked = 'budget',"
                " parked_at = coalesce(parked_at, now()), updated_at = now() WHERE batch = %s"
                " AND parked IS DISTINCT FROM 'cancelled'",
                (batch,),
            )
            cur = await conn.execute(
                "UPDATE herd_eval_items SET status = 'parked' WHERE batch = %s"
                " AND status = 'queued' RETURNING job_id",
                (batch,),
            )
            return sorted({job_id for (job_id,) in await cur.fetchall()})

    async def set_budget(
        self, batch: str, budget: float | None
    ) -> tuple[dict[str, Any], list[int]]:
        """Set a batch's budget; if it is parked and there is room now, unpark it. Returns
        the batch and the jobs to bring back (their items are queued again)."""
        async with self.transaction() as conn:
            cur = await conn.execute(
                "UPDATE herd_eval_batches SET budget = %(budget)s, updated_at = now()"
                " WHERE batch = %(b)s RETURNING spent, reserved, parked",
                {"b": batch, "budget": budget},
            )
            row = await cur.fetchone()
            if row is None:
                cur = await conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM herd_eval_items WHERE batch = %s)", (batch,)
                )
                if not (await cur.fetchone() or (False,))[0]:
                    raise BatchNotFound(f"no batch named {batch!r}")
                await conn.execute(  # a batch submitted before batches had rows
                    "INSERT INTO herd_eval_batches (batch, budget) VALUES (%s, %s)",
                    (batch, budget),
                )
                row = (0.0, 0.0, None)
            spent, reserved, parked = row
            ids: list[int] = []
            if parked == "budget" and (budget is None or spent + reserved < budget):
                await conn.execute(
                    "UPDATE herd_eval_batches SET parked = NULL, parked_at = NULL WHERE batch = %s",
                    (batch,),
                )
                cur = await conn.execute(
                    "UPDATE herd_eval_items SET status = 'queued' WHERE batch = %s"
                    " AND status = 'parked' RETURNING job_id",
                    (batch,),
                )
                ids = sorted({job_id for (job_id,) in await cur.fetchall()})
        found = await self.batch(batch)
        assert found is not None
        return found, ids

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
            rows = await self.execute(ledger.TOTALS)
        else:
            rows = await self.execute(ledger.BATCH_TOTALS, {"b": batch})
        return {
            kind: {
                "n": int(n),
                "input_tokens": int(i),
                "output_tokens": int(o),
                "cost": c,
                "saved": s,
                "cached_input_tokens": int(ci),
                "cache_write_tokens": int(cw),
                "provider_cache_saved": ps,
            }  # fmt: skip
            for kind, n, i, o, c, s, ci, cw, ps in rows
        }

    async def _delete(self, query: str, keep: float, limit: int) -> int:
        with translate_errors(self.url):
            async with self.pool.connection() as conn:
                cur = await conn.execute(query, {"keep": keep, "limit": limit})
                return cur.rowcount

    async def purge(self, *, ledger_ttl: float | None = None, eval_ttl: float | None = None) -> int:
        """Delete what is past its retention (default: the store's settings), in bounded
        batches oldest first; returns how many rows went. A document or spec that a
        queued item's job will read stays, whatever its age."""
        keep_ledger = self.ledger_ttl if ledger_ttl is None else ledger_ttl
        keep_eval = self.eval_ttl if eval_ttl is None else eval_ttl
        steps: list[tuple[str, float]] = []
        if keep_ledger:
            steps += [(ledger.PURGE_LEDGER, keep_ledger), (ledger.PURGE_KEYS, keep_ledger)]
        if keep_eval:
            steps += [(ledger.PURGE_ITEMS, keep_eval), (ledger.PURGE_BATCH_TOTALS, keep_eval)]
            legacy = await self.execute(ledger.LEGACY_QUEUED)
            if not legacy[0][0]:
                steps += [(ledger.PURGE_DOCUMENTS, keep_eval), (ledger.PURGE_SPECS, keep_eval)]
            steps.append((ledger.PURGE_PROVIDER_BATCHES, keep_eval))
            steps.append((ledger.PURGE_BATCHES, keep_eval))
        removed = 0
        if keep_ledger:  # calls open that long: their workers died, nobody took over
            while await self._cut_short_old(keep_ledger, 1000) == 1000:
                pass
        for query, keep in steps:
            removed += await in_batches(functools.partial(self._delete, query, keep))
        return removed

    async def _cut_short_old(self, keep: float, limit: int) -> int:
        with translate_errors(self.url):
            async with self.pool.connection() as conn:
                return await ledger.cut_short(conn, keep=keep, limit=limit)


@dataclass
class EvalRuntime:
    """A worker process's resources for evaluations, opened on first use."""

    store: EvalStore
    cache: ExactCache
    prices: PriceTable
    providers: dict[tuple[str, str, bool], Provider] = field(default_factory=dict)
    max_tokens: int = EVAL_MAX_TOKENS  # the setting eval_max_tokens
    # The fleet's provider limits, kept in the job store (None: a broker without one).
    limiter: Limiter | None = None
    limits_file: LimitsFile | None = None  # HERD_LIMITS
    max_wait: float = 30.0  # the setting limit_max_wait
    _batch_limits: dict[str, tuple[float, Limit]] = field(default_factory=dict)

    @classmethod
    async def of(cls, app: App) -> EvalRuntime:
        runtime = app.state.get("eval")
        if runtime is None:
            lock = app.state.setdefault("eval.lock", asyncio.Lock())
            async with lock:
                runtime = app.state.get("eval")
                if runtime is None:
                    runtime = await cls._open(app)
                    app.state["eval"] = runtime
        assert isinstance(runtime, EvalRuntime)
        return runtime

    @classmethod
    async def _open(cls, app: App) -> EvalRuntime:
        url = app.database_url()
        cache_store, locks = cache_stores(app.settings, database_url=url)
        prices = PriceTable.default()
        if os.environ.get("HERD_PRICES"):  # a JSON file of per-model prices
            prices = prices.merged(PriceTable.from_file(os.environ["HERD_PRICES"]))
        settings = app.settings
        store = EvalStore(url, ledger_ttl=settings.ledger_ttl, eval_ttl=settings.eval_ttl)
        limits_file = load_limits(settings.limits_path) if settings.limits_path else None
        try:
            limiter: Limiter | None = for_broker(app.broker.name, getattr(app.broker, "url", ""))
        except ValueError:  # a broker of a kind herd.limits has no store for
            limiter = None
        opened: list[Any] = []

        async def close() -> None:
            for provider in runtime.providers.values():
                await provider.aclose()
            for part in reversed(opened):
                await part.close()

        runtime = cls(
            store,
            ExactCache(
                cache_store,
                locks,
                namespace="eval",
                ttl=settings.cache_ttl or None,
                lock_ttl=settings.eval_lock_ttl,
            ),
            prices,
            max_tokens=app.settings.eval_max_tokens,
            limiter=limiter,
            limits_file=limits_file,
            max_wait=float(settings.limit_max_wait),
        )
        try:
            # Each part is closed with the app once open: one that fails to open
            # must not leave the others' pools behind.
            parts: list[Any] = [store, cache_store, locks, *([limiter] if limiter else [])]
            for part in parts:
                await part.open()
                opened.append(part)
        except BaseException:
            await close()
            raise
        app.on_close(close)
        return runtime

    def provider(self, spec: EvalSpec, *, limited: bool = False) -> Provider:
        """The spec's provider client; ``limited``: one that raises a 429 at once, for the
        fleet's limiter to pause the limit and decide when to try again."""
        found = self.providers.get((spec.provider, spec.model, limited))
        if found is None:
            retry = RetryPolicy(retry_rate_limited=False) if limited else None
            if spec.provider == "openai":
                found = OpenAICompatible(model=spec.model, retry=retry)
            elif spec.provider == "anthropic":
                # Anthropic needs a max_tokens: its default, unless the setting is lower.
                found = Anthropic(
                    model=spec.model,
                    max_tokens=min(DEFAULT_MAX_TOKENS, self.max_tokens),
                    retry=retry,
                )
            else:
                raise Fatal(f"unknown provider {spec.provider!r}: use openai or anthropic")
            self.providers[(spec.provider, spec.model, limited)] = found
        return found

    async def limit_for(self, spec: EvalSpec, key: str, batch: str | None) -> Limit:
        """The limit a call of ``spec`` under API key id ``key`` obeys: HERD_LIMITS's entry
        and the batch's own limits, the stricter of each."""
        limit = (
            self.limits_file.limit_for(spec.provider, spec.model, key)
            if self.limits_file
            else Limit()
        )
        if batch is None:
            return limit
        now = time.monotonic()
        cached = self._batch_limits.get(batch)
        if cached is None or now - cached[0] > BATCH_LIMITS_TTL:
            row = await self.store.batch(batch)
            stored = row.get("limits") if row else None
            try:
                own = Limit.from_json(stored or {}, where=f"batch {batch!r} limits")
            except InvalidInput as exc:
                raise Fatal(str(exc)) from None
            if len(self._batch_limits) > 1000:  # bounded: batches come and go
                self._batch_limits.clear()
            cached = self._batch_limits[batch] = (now, own)
        return limit.stricter(cached[1])


def validate_answer(text: str, schema: dict[str, Any] | None) -> tuple[JSON, str | None]:
    """The parsed answer and None, or the raw text and what is wrong with it."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return text, f"the answer is not JSON ({exc})"
    if schema is not None:
        try:
            jsonschema.validate(value, schema)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
            return text, f"the answer does not match the schema at {where}: {exc.message}"
    return value, None


REPAIR = (
    "{document}\n\n---\nYour previous answer was:\n{answer}\n\nIt was rejected: {error}.\n"
    "Answer again with JSON only, following the schema exactly."
)


def fenced(ctx: JobContext, store: EvalStore) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
    """A transaction that commits only while the job's lease holds: the broker's own on
    PostgreSQL; on another broker, the evaluation store's after a lease check."""
    return ctx.fenced_transaction(store.transaction)


def _sent_kind(exc: ProviderError) -> str | None:
    """How a call that raised closes: 'failed' when the request may have been billed
    (it timed out waiting for the answer, or the answer was unreadable), None when
    it never reached generation (not connected; an error status answered before
    generating, as the providers and the simulator do)."""
    if isinstance(exc, ProviderResponseInvalid):
        return "failed"
    if isinstance(exc, ProviderTimeout):
        cause = exc.__cause__
        return None if isinstance(cause, httpx.ConnectTimeout | httpx.PoolTimeout) else "failed"
    if exc.status is None:  # transport: refused before sending, or dropped mid-answer
        return None if isinstance(exc.__cause__, httpx.ConnectError) else "failed"
    return None


def _sent_max(spec: EvalSpec, provider: Provider, default_max: int) -> int:
    """The most output tokens the request asks for: its params', else what the
    provider sends by itself (Anthropic's max_tokens), else ``default_max``."""
    asked = requested_max(spec.params)
    if asked is not None:
        return asked
    own = getattr(provider, "max_tokens", None)
    return own if isinstance(own, int) and own > 0 else default_max


def _charged(spec: EvalSpec, provider: Provider, done: Completion, default_max: int) -> int:
    """Tokens the provider's limiter counted for a call: the input it reports, and the
    max output the request asked for when it named one (OpenAI counts max_tokens up
    front, whatever the answer; so does the simulator), else the output reported."""
    named = requested_max(spec.params) is not None
    named = named or isinstance(getattr(provider, "max_tokens", None), int)
    out = _sent_max(spec, provider, default_max) if named else done.usage.output_tokens
    return done.usage.input_tokens + out


def _pause_for(exc: RateLimited) -> float:
    return exc.retry_after if exc.retry_after is not None else DEFAULT_PAUSE


async def _park(app: App, store: EvalStore, batch: str, job_id: int) -> Snooze:
    """Park the batch for its budget: its waiting items marked, its other pending jobs
    moved out of reach; this job hands itself back (no attempt counted)."""
    ids = [i for i in await store.park(batch) if i != job_id]
    if ids:
        await app.broker.reschedule(ids, PARK_DELAY)
    return Snooze(f"batch {batch!r} is parked: its budget is spent", after=PARK_RECHECK)


async def evaluate(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The built-in evaluation task (registered in herd.builtin)."""
    rt = await EvalRuntime.of(ctx.app)
    key, batch = payload["key"], payload.get("batch")
    # A call the previous run of this job left open was cut short by its death.
    await rt.store.cut_short(ctx.job_id)
    spec = await rt.store.spec(payload["spec"])
    try:
        spec.check(ctx.app.settings)
    except InvalidInput as exc:  # enqueued under a higher HERD_EVAL_MAX_TOKENS
        raise Fatal(str(exc)) from None
    if payload.get("batch_failed") and ctx.lease.token == 1:
        # Failed by a provider batch and by its retry batch: dead-lettered with the
        # provider's error. Requeued from the dead letters, it runs synchronously.
        raise Fatal(f"the provider's batches failed this request twice: {payload['batch_error']}")
    document = await rt.store.document(payload["doc"])
    plain = rt.provider(spec)
    scope_key = getattr(plain, "key_id", "nokey")
    limit = await rt.limit_for(spec, scope_key, batch) if rt.limiter else Limit()
    provider = rt.provider(spec, limited=True) if limit else plain
    scope = scope_name(spec.provider, spec.model, scope_key)
    price = rt.prices.lookup(spec.model, spec.provider)

    def priced(i: int, o: int = 0) -> float | None:
        return None if price is None else price.cost(Usage(i, o))

    async def open_call(estimate: int, worst: float | None) -> int:
        """Reserve the worst case against the budget and open the call's ledger row,
        in one transaction fenced by the lease: a worker that lost it opens nothing."""
        row = {"batch": batch, "job": ctx.job_id, "key": key, "model": spec.model,
               "provider": spec.provider, "i": estimate, "w": worst}  # fmt: skip
        async with fenced(ctx, rt.store) as conn:
            if batch is not None:
                cur = await conn.execute(ledger.RESERVE, {"b": batch, "w": worst or 0.0})
                reserved = await cur.fetchone()
                if reserved is None:
                    cur = await conn.execute(ledger.BATCH, {"b": batch})
                    found = await cur.fetchone()
                    if found is not None and found[3] == "cancelled":
                        raise BatchCancelled
                    if found is not None:
                        raise OverBudget
                elif reserved[0] is not None and worst is None:
                    raise Fatal(
                        f"model {spec.model!r} has no price, so batch {batch!r}'s budget"
                        " cannot be kept: add it to the price table (HERD_PRICES)"
                    )
            return await ledger.open_call(conn, row)

    async def call(user: str) -> Completion:
        """One provider call under the fleet's limit of its scope, when one is set.

        Capacity is taken before the budget and the ledger row: a job that waits too
        long is handed back (Snooze: no attempt, no lease held meanwhile) with nothing to
        undo. A 429 pauses the limit for the whole fleet and the call waits its turn
        again; the reservation is reconciled with what the provider counts."""
        if not limit:
            return await send(user)
        assert rt.limiter is not None
        tokens = estimate_input(spec.provider, spec.model, spec.system, user) + estimate_output(
            spec.params, spec.schema, _sent_max(spec, provider, rt.max_tokens)
        )
        holder = f"{ctx.worker_id}:{ctx.job_id}:{ctx.lease.token}:{uuid.uuid4().hex[:8]}"
        for _ in range(MAX_RATE_LIMITED):
            try:
                async with hold(
                    rt.limiter, scope, limit, tokens, holder=holder, hold_for=SLOT_HOLD,
                    max_wait=rt.max_wait,
                ) as slot:  # fmt: skip
                    try:
                        done = await send(user)
                    except RateLimited as exc:
                        # The provider's own count disagrees with ours (another client on
                        # the key, a lower tier): everyone waits, not only this worker.
                        await slot.adjust(0)  # a refusal is charged nothing
                        await rt.limiter.pause(scope, _pause_for(exc))
                        continue
                    except (Snooze, BatchCancelled):  # parked or cancelled: nothing was sent
                        await slot.adjust(0)
                        raise
                    await slot.adjust(_charged(spec, provider, done, rt.max_tokens))
                    return done
            except CapacityTimeout as exc:
                raise Snooze(str(exc), after=max(1.0, exc.retry_in)) from None
            except InvalidInput as exc:  # a call larger than its limit can ever allow
                raise Fatal(str(exc)) from None
        raise Snooze(
            f"{scope}: the provider answered 429 {MAX_RATE_LIMITED} times in a row",
            after=DEFAULT_PAUSE * MAX_RATE_LIMITED,
        )

    async def send(user: str) -> Completion:
        await ctx.check_lease()  # a worker resumed after a pause pays for nothing
        estimate, most = reservation_tokens(spec, user, default_max=rt.max_tokens)
        try:
            call_id = await open_call(estimate, priced(estimate, most))
        except OverBudget:
            assert batch is not None
            raise await _park(ctx.app, rt.store, batch, ctx.job_id) from None
        with telemetry.model_call(spec.provider, spec.model) as span:
            try:
                done = await provider.complete(
                    spec.system, user, schema=spec.schema, params=spec.params
                )
            except asyncio.CancelledError:
                # The lease was lost (or the worker stops) mid-call: the request is
                # aborted, but its input was already paid for. Estimated: no usage came.
                await asyncio.shield(rt.store.close_call(call_id, "lost", cost=priced(estimate)))
                raise
            except RateLimited as exc:
                await rt.store.close_call(call_id, None)  # refused before generating: not billed
                if limit:
                    raise
                # Capacity, not the job, is at fault: handed back with no attempt counted.
                raise Snooze(str(exc), after=_pause_for(exc) * (1 + random.random())) from None
            except ProviderError as exc:
                kind = _sent_kind(exc)
                await rt.store.close_call(call_id, kind, cost=priced(estimate) if kind else None)
                raise
            except BaseException:
                await rt.store.close_call(call_id, "failed", cost=priced(estimate))
                raise
            cost = rt.prices.cost_of(spec.model, done.usage, spec.provider)
            span.answered(done, cost)
        await rt.store.close_call(
            call_id,
            "call",
            i=done.usage.input_tokens,
            o=done.usage.output_tokens,
            cost=cost,
            cached=done.usage.cached_input_tokens,
            written=done.usage.cache_write_tokens,
            provider_saved=None if price is None else price.cache_saved(done.usage),
        )
        return done

    async def compute() -> JSON:
        first = await call(document)
        value, error = validate_answer(first.text, spec.schema)
        if error is None:
            return {"output": value, "model": first.model}
        second = await call(REPAIR.format(document=document, answer=first.text, error=error))
        value, error2 = validate_answer(second.text, spec.schema)
        if error2 is None:
            return {"output": value, "model": second.model, "repaired": True}
        raise Fatal(f"invalid model output after one repair: {error2}; raw output: {second.text}")

    try:
        # Owned by the job, not the process: a run that takes this job over from a
        # worker that died mid-call takes its lock on the key at once, rather than
        # waiting out the lock's ttl (HERD_EVAL_LOCK_TTL) for a holder that is gone.
        found = await rt.cache.get_or_compute(key, compute, owner=f"herd-job:{ctx.job_id}")
    except BatchCancelled:
        await rt.store.execute(
            "UPDATE herd_eval_items SET status = 'cancelled', finished_at = now()"
            " WHERE job_id = %s AND status IN ('queued', 'parked')",
            (ctx.job_id,),
        )
        return {"key": key, "path": payload.get("path"), "cancelled": True}
    telemetry.model_served(spec.provider, spec.model, found.source)
    if found.source in ("hit", "waited", "stale"):
        kind = "singleflight" if found.source == "waited" else "cache"
        await rt.store.record(
            batch=batch,
            job_id=ctx.job_id,
            key=key,
            kind=kind,
            model=spec.model,
            provider=spec.provider,
        )
    result = {"key": key, "path": payload.get("path"), "source": found.source, **dict(found.value)}
    # Every item this job serves: documents deduplicated onto it share its result.
    item = (
        "UPDATE herd_eval_items SET status = 'done', source = %s, result = %s,"
        " finished_at = now() WHERE job_id = %s AND status <> 'done'"
    )
    async with fenced(ctx, rt.store) as conn:  # lands only while this job's lease holds
        await conn.execute(item, (found.source, Jsonb(result), ctx.job_id))
    return result


async def submit(
    app: App,
    paths: Iterable[Path],
    spec: EvalSpec,
    *,
    batch: str | None = None,
    priority: int = 0,
    progress: Callable[[int], None] | None = None,
    chunk: int = 200,
    budget: float | None = None,
    limits: dict[str, Any] | None = None,
    batch_api: bool = False,
) -> SubmitReport:
    """Enqueue one evaluation job per readable document; report the unreadable ones.

    ``budget``: USD the batch's calls may cost (None: unchanged, none for a new
    batch); ``limits``: rpm, tpm and max_concurrent, stored with the batch.
    ``batch_api``: through the provider's Batch API at half the price (herd.llm.batchapi)."""
    from herd.llm import batchapi  # it builds on this module

    spec.check(app.settings)  # before a single document is read
    check_budget(budget)
    check_limits(limits)
    if batch_api:
        batchapi.check_provider(spec)
        batchapi.check_unlimited(budget, limits)
        chunk = max(chunk, batchapi.chunk_size(app))
    report = SubmitReport(batch or f"eval-{uuid.uuid4().hex[:8]}")
    try:
        files = list(find_documents(paths))
    except DocumentError as exc:
        report.errors.append(str(exc))
        return report
    for start in range(0, len(files), chunk):
        items: list[tuple[str, str]] = []  # path, normalized text
        for path in files[start : start + chunk]:
            try:
                items.append((str(path), normalize_document(read_document(path))))
            except DocumentError as exc:
                report.errors.append(str(exc))
        if batch_api:
            enqueued = await batchapi.enqueue_batch_documents(
                app, spec, report.batch, items, priority=priority
            )
        else:
            enqueued = await enqueue_documents(
                app, spec, report.batch, items, priority=priority, budget=budget, limits=limits
            )
        for r in enqueued:
            report.job_ids.append(r.job_id)
            if r.created:
                report.queued += 1
            else:
                report.deduplicated += 1
        if progress:
            progress(min(len(files), start + chunk))
    return report


async def enqueue_documents(
    app: App,
    spec: EvalSpec,
    batch: str,
    items: list[tuple[str, str]],
    *,
    priority: int = 0,
    budget: float | None = None,
    limits: dict[str, Any] | None = None,
) -> list[EnqueueResult]:
    """One job per (name, normalized text); identical evaluations share a job.

    Stores the batch's row (its budget and limits, where given), the documents, the
    batch's items and a dedup ledger row for each document that joined an existing
    job, so ``herd eval status`` sees it all.
    """
    spec.check(app.settings)
    check_text(batch, "batch")
    budget = check_budget(budget)
    checked_limits = check_limits(limits)
    check(asdict(spec), what="spec")
    for i, (name, text) in enumerate(items):
        check_text(name, f"documents[{i}].name")
        check_text(text, f"documents[{i}].text")
    if not items:
        return []
    rt = await EvalRuntime.of(app)
    rows = [
        (name, hashlib.sha256(text.encode()).hexdigest(), spec.key(text)) for name, text in items
    ]
    # Before the jobs: a worker that claims one finds the budget already in force.
    await rt.store.put_batch(batch, budget=budget, limits=checked_limits)
    if budget is not None:  # raised by this submission: parked jobs may resume
        await set_budget(app, batch, budget)
    await rt.store.put_spec(spec)
    await rt.store.put_documents(
        {d: text for (_, d, _), (_, text) in zip(rows, items, strict=True)}
    )
    results = await app.enqueue_many(
        TASK,
        [{"batch": batch, "path": p, "doc": d, "spec": spec.hash, "key": k} for p, d, k in rows],
        queue=QUEUE,
        priority=priority,
        dedup_keys=[k for _, _, k in rows],
    )
    await rt.store.execute(
        # doc and spec: what the job will read, kept from retention while this is queued.
        "INSERT INTO herd_eval_items (batch, path, key, job_id, doc, spec) SELECT %s, p, k, j,"
        " d, %s FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::text[]) AS x(p, k, j, d)"
        " ON CONFLICT DO NOTHING",
        (
            batch,
            spec.hash,
            [p for p, _, _ in rows],
            [k for _, _, k in rows],
            [r.job_id for r in results],
            [d for _, d, _ in rows],
        ),
    )
    for (_, _, k), r in zip(rows, results, strict=True):
        if not r.created:
            await rt.store.record(
                batch=batch,
                job_id=r.job_id,
                key=k,
                kind="dedup",
                model=spec.model,
                provider=spec.provider,
            )
    return results


async def set_budget(app: App, batch: str, budget: float | None) -> dict[str, Any]:
    """Raise or lower a batch's budget (None: no budget). A parked batch with room
    again resumes: its items are queued and its jobs due at once."""
    check_text(batch, "batch")
    budget = check_budget(budget)
    rt = await EvalRuntime.of(app)
    found, ids = await rt.store.set_budget(batch, budget)
    if ids:
        await app.broker.reschedule(ids, 0)
    return {**found, "resumed": len(ids)}


async def jobs_of(app: App, ids: list[int]) -> list[Job]:
    """The jobs ``ids``, one round trip per thousand."""
    jobs: list[Job] = []
    for start in range(0, len(ids), 1000):
        jobs += await app.broker.get_jobs(ids[start : start + 1000])
    return jobs


async def settle(app: App, batch: str | None) -> dict[str, int]:
    """Bring a batch's items (all batches: None) up to date with their jobs; count
    them by state.

    A document deduplicated onto a job that finished while it was being submitted
    misses the job's own update of its items, so the job's result is copied here.
    """
    rt = await EvalRuntime.of(app)
    items = await rt.store.execute(
        # Parked items too: a job running when its batch parked is still running.
        "SELECT DISTINCT job_id FROM herd_eval_items WHERE status IN ('queued', 'parked')"
        " AND (%(b)s::text IS NULL OR batch = %(b)s)",
        {"b": batch},
    )
    counts = {"failed": 0, "running": 0}
    for job in await jobs_of(app, [job_id for (job_id,) in items]):
        if job.task in BATCH_API_TASKS:
            if job.status == "succeeded":
                from herd.llm.batchapi import settle_late  # batchapi imports this module

                await settle_late(app, job)
            elif job.status == "dead":
                counts["failed"] += 1
            elif job.status == "processing":
                counts["running"] += 1
            continue
        if job.status == "succeeded" and isinstance(job.result, dict):
            await rt.store.execute(
                "UPDATE herd_eval_items SET status = 'done', source = %s, result = %s,"
                " finished_at = now() WHERE job_id = %s AND status IN ('queued', 'parked')",
                (job.result.get("source"), Jsonb(job.result), job.id),
            )
        elif job.status == "dead":
            counts["failed"] += 1
        elif job.status == "processing":
            counts["running"] += 1
    return counts


async def batch_status(app: App, batch: str | None) -> dict[str, Any]:
    """Progress of a batch (all: None) and its cost ledger: calls made and avoided."""
    rt = await EvalRuntime.of(app)
    counts = await settle(app, batch)
    failed, running = counts["failed"], counts["running"]
    # Counted by the server: one row back, whatever the batch's size.
    ((documents, done, parked, cancelled),) = await rt.store.execute(
        "SELECT count(*), count(*) FILTER (WHERE status = 'done'),"
        " count(*) FILTER (WHERE status = 'parked'),"
        " count(*) FILTER (WHERE status = 'cancelled') FROM herd_eval_items"
        " WHERE %(b)s::text IS NULL OR batch = %(b)s",
        {"b": batch},
    )
    # The ledger's summary (of the batch, or of all time), not its rows: it costs
    # O(kinds) and keeps the totals of rows past HERD_LEDGER_TTL.
    totals = await rt.store.totals(batch)
    row = await rt.store.batch(batch) if batch is not None else None
    return {
        "batch": batch,
        "documents": int(documents),
        "done": int(done),
        "failed": failed,
        "running": running,
        "parked_items": int(parked),
        "cancelled_items": int(cancelled),
        "budget": row["budget"] if row else None,
        "spent": row["spent"] if row else None,
        "reserved": row["reserved"] if row else None,
        "parked": row["parked"] if row else None,
        "limits": row["limits"] if row else {},
        "limit_usage": await _limit_usage(rt, batch),
        "ledger": totals,
        "provider_cache": provider_cache(totals),
    }


def provider_cache(totals: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the provider's prompt cache served over the ledger's kinds, apart from herd's
    own cache: input tokens read from it, written to it, and the money saved (None: no
    priced call)."""
    saved = [t["provider_cache_saved"] for t in totals.values()]
    priced = [s for s in saved if s is not None]
    return {
        "cached_input_tokens": sum(t["cached_input_tokens"] for t in totals.values()),
        "cache_write_tokens": sum(t["cache_write_tokens"] for t in totals.values()),
        "saved": sum(priced) if priced else None,
    }


async def _limit_usage(rt: EvalRuntime, batch: str | None) -> list[dict[str, Any]]:
    """The fleet-wide limits a batch's calls count against (all of them: None), with
    their use, waits and 429s. A limit is per provider, model and key: the batch's
    specs name the first two; every key's limit of those is shown."""
    if rt.limiter is None:
        return []
    found = await rt.limiter.stats()
    if batch is not None:
        specs = await rt.store.execute(
            "SELECT s.spec->>'provider', s.spec->>'model' FROM herd_eval_specs s"
            " WHERE s.hash IN (SELECT DISTINCT spec FROM herd_eval_items WHERE batch = %s)",
            (batch,),
        )
        prefixes = tuple(f"{p}:{m}:" for p, m in specs)
        found = [s for s in found if s.scope.startswith(prefixes)] if prefixes else []
    now = time.time()
    return [
        {
            "scope": s.scope,
            "limit": s.limit.to_json(),
            "requests_now": round(s.requests_now, 2),
            "tokens_now": round(s.tokens_now, 2),
            "in_flight": s.in_flight,
            "requests": s.requests,
            "tokens": s.tokens,
            "waits": s.waits,
            "wait_seconds": round(s.wait_seconds, 3),
            "rate_limited": s.rate_limited,
            "paused_for": round(max(0.0, (s.paused_until or 0.0) - now), 3),
        }
        for s in found
    ]
