"""The evaluation task: one document, one spec, answered once.

A job carries hashes only (document, spec, canonical key); the texts live in the
evaluation store. The task looks the canonical key up in the exact cache; on a miss it
takes the key's singleflight lock and calls the provider, validates the answer against
the schema (one repair attempt that shows the model its error), and stores it. Every
call made or avoided is a row of the cost ledger, and every call is opened in the
ledger, and reserved against the batch's budget, before its request leaves.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from decimal import Decimal
from functools import partial
from typing import Any

import httpx
from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from herd import aio, telemetry
from herd.app import App
from herd.cache.exact import Lookup
from herd.context import JobContext
from herd.errors import BrokerError, Fatal, InvalidInput, LeaseLost, Snooze
from herd.jsonvalue import JSON
from herd.limits import (
    CapacityTimeout,
    Limit,
    PoolKey,
    Share,
    Slot,
    batch_scope,
    hold_any,
    scope_name,
)
from herd.limits.tokens import estimate_input, estimate_output, requested_max
from herd.llm.completion import Completion, Usage
from herd.llm.errors import (
    ProviderAuthError,
    ProviderError,
    ProviderResponseInvalid,
    ProviderTimeout,
    RateLimited,
)
from herd.llm.eval import fallback, ledger
from herd.llm.eval.fallback import ModelUnavailable
from herd.llm.eval.money import money
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.spec import (
    REPAIR,
    BatchCancelled,
    EvalSpec,
    OverBudget,
    reservation_tokens,
    validate_answer,
)
from herd.llm.eval.store import EvalStore

log = logging.getLogger("herd.eval")

# A parked batch's pending jobs are moved this far out of reach; raising the budget or
# resuming brings them back at once.
PARK_DELAY = 10 * 365 * 86400.0
# The job that parks its batch looks again this often: a budget raised (or a batch
# resumed) while it was handing itself back would otherwise miss it (it was running,
# not pending).
PARK_RECHECK = 60.0
# A call whose worst case fits what is left of the budget, but not beside the worst
# cases reserved by calls in flight, looks again this soon: those calls settle at their
# real cost (usually far below the worst case), and the room comes back.
IN_FLIGHT_RECHECK = 2.0
# A 429 that says nothing of when to come back pauses its limit this long.
DEFAULT_PAUSE = 1.0
# 429s in a row one call takes before its job is handed back (no attempt counted).
MAX_RATE_LIMITED = 5
# A pool's key the provider refused (401/403) is passed over by the whole fleet this
# long; then one call tries it again (a key rotated back, a permission granted).
KEY_REFUSED_PAUSE = 600.0
# A concurrency slot of a worker that died frees itself after this long (a live one is
# renewed every third of it).
SLOT_HOLD = 60.0


class KeyRefused(Exception):
    """The provider refused one key of a pool (401/403): the call moves to another."""

    def __init__(self, key_id: str, reason: str) -> None:
        super().__init__(reason)
        self.key_id, self.reason = key_id, reason


def fenced(ctx: JobContext, store: EvalStore) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
    """A transaction that commits only while the job's lease holds: the broker's own on
    PostgreSQL; on another broker, the evaluation store's after a lease check."""
    return ctx.fenced_transaction(store.transaction)


def sent_kind(exc: ProviderError) -> str | None:
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


def refusal(exc: ProviderError) -> str | None:
    """The provider's refusal of the whole batch (its key, its model), in its words;
    None for an error of this call only."""
    if isinstance(exc, ProviderAuthError) or exc.status == 404:
        return f"{exc.provider or 'the provider'} refused the call: {exc}"
    return None


async def park(
    app: App, store: EvalStore, batch: str, job_id: int, why: str, reason: str
) -> Snooze:
    """Park the batch: its waiting items marked, its other pending jobs moved out of
    reach; the job that found it hands itself back (no attempt counted)."""
    ids = [i for i in await store.park(batch, why, reason) if i != job_id]
    if ids:
        await app.broker.reschedule(ids, PARK_DELAY)
    return Snooze(f"batch {batch!r} is parked: {reason}", after=PARK_RECHECK)


class Evaluation:
    """One run of one evaluation job."""

    def __init__(
        self, rt: EvalRuntime, ctx: JobContext, payload: dict[str, Any], spec: EvalSpec
    ) -> None:
        self.rt, self.ctx, self.spec = rt, ctx, spec
        self.key: str = payload["key"]
        self.batch: str | None = payload.get("batch")
        self.price = rt.prices.lookup(spec.model, spec.provider)
        # A key pool (HERD_LIMITS): the keys a call may go to, each under a scope and a
        # limit of its own; the limiter picks one with room for each call (without a
        # limiter, the first key takes them all). Empty: the provider's one key.
        self.pool: tuple[PoolKey, ...] = rt.pool(spec)
        self.first = self.pool[0] if self.pool else None
        self.plain = rt.provider(spec, key=self.first)
        self.scope = scope_name(spec.provider, spec.model, self.plain.key_id)
        self.limit = Limit()  # the fleet's (HERD_LIMITS), kept under self.scope
        self.key_id = self.plain.key_id  # the key of this call: what the ledger names
        # The batch's own, under a scope of its own: merged into the fleet's, it would
        # become the limit (and the rate state) of every batch on the key.
        self.batch_scope = batch_scope(self.batch, spec.provider, spec.model) if self.batch else ""
        self.batch_limit = Limit()
        # The batch's flow in the fair share of the fleet's scope (None: not a batch's).
        self.share: Share | None = None
        self.provider = self.plain
        # With a fallback to move to (herd.llm.eval.fallback): the model's unavailability,
        # and a 429 pause longer than this, raise ModelUnavailable instead.
        self.fallback_after: float | None = None
        # Calls answered and not yet closed in the ledger: (row id, usage), see send.
        self.paid: list[tuple[int, dict[str, Any]]] = []

    async def limited(self) -> None:
        """Take the fleet's limit of this call's scope and the batch's own, where set."""
        if self.rt.limiter:
            self.limit = self.rt.limit_for(self.spec, self.plain.key_id)
            self.batch_limit = await self.rt.batch_limit(self.batch)
            if self.batch is not None:
                self.share = Share(self.batch, await self.rt.batch_weight(self.batch))
        if self.limit or self.batch_limit:
            self.provider = self.rt.provider(
                self.spec, limited=True, failover=self.failover, key=self.first
            )

    @property
    def pooled(self) -> bool:
        """Calls go to a pool of keys, one picked per call by the limiter."""
        return len(self.pool) > 1 and self.rt.limiter is not None

    @property
    def failover(self) -> bool:
        return self.fallback_after is not None

    def fall_back_after(self, seconds: float) -> None:
        """This call has a fallback: the model's unavailability, or a 429 pause longer than
        ``seconds``, raises ModelUnavailable; a 5xx is retried once, not backed off."""
        self.fallback_after = seconds
        self.plain = self.provider = self.rt.provider(self.spec, failover=True, key=self.first)

    def priced(self, i: int, o: int = 0) -> Decimal | None:
        return None if self.price is None else money(self.price.cost(Usage(i, o)))

    async def open_call(self, estimate: int, worst: Decimal | None) -> int:
        """Reserve the worst case against the budget and open the call's ledger row,
        in one transaction fenced by the lease: a worker that lost it opens nothing."""
        spec, batch = self.spec, self.batch
        row = {"batch": batch, "job": self.ctx.job_id, "key": self.key, "model": spec.model,
               "provider": spec.provider, "i": estimate, "w": worst,
               "kid": self.key_id}  # fmt: skip
        async with fenced(self.ctx, self.rt.store) as conn:
            if batch is not None:
                budgeted = await ledger.reserve(conn, batch, worst)
                if budgeted is None:
                    rows = await EvalStore.on(conn, "batch", b=batch)
                    found = rows[0] if rows else None
                    if found is not None and found[3] == "cancelled":
                        raise BatchCancelled
                    if found is not None and found[3] == "refused":
                        raise Snooze(f"batch {batch!r} is parked: {found[5]}", after=PARK_RECHECK)
                    if found is not None and _held_by_calls_in_flight(found, worst):
                        raise Snooze(
                            f"batch {batch!r}: the rest of its budget is reserved by calls"
                            " in flight; waiting for them to settle",
                            after=IN_FLIGHT_RECHECK,
                        )
                    if found is not None:
                        raise OverBudget
                elif budgeted and worst is None:
                    raise Fatal(
                        f"model {spec.model!r} has no price, so batch {batch!r}'s budget"
                        " cannot be kept: add it to the price table (HERD_PRICES)"
                    )
            return await ledger.open_call(conn, row)

    async def call(self, user: str) -> Completion:
        """One provider call under the limits that apply to it: the batch's own scope
        first, then the fleet's scope (provider, model, key), both held for the call.

        Capacity is taken before the budget and the ledger row: a job that waits too
        long is handed back (Snooze: no attempt, no lease held meanwhile) with nothing to
        undo. A 429 pauses the fleet's scope for the whole fleet and the call waits its
        turn again; the reservations are reconciled with what the provider counts."""
        if not (self.limit or self.batch_limit or self.pooled):
            return await self.send(user)
        rt, spec, ctx = self.rt, self.spec, self.ctx
        assert rt.limiter is not None
        most, named = rt.most_output(spec, requested_max(spec.params))
        tokens = estimate_input(spec.provider, spec.model, spec.system, user) + estimate_output(
            spec.params, spec.schema, most
        )
        holder = f"{ctx.worker_id}:{ctx.job_id}:{ctx.lease.token}:{uuid.uuid4().hex[:8]}"
        # The batch's scope first: a call waiting on its own batch's limit holds no share
        # of the fleet's meanwhile. The fleet's scope is held even with no HERD_LIMITS
        # entry (an empty limit): a 429 pauses it, and this batch must wait that out too.
        # Batches on one fleet scope share it by their weights; the batch's own is its own.
        # With a key pool, the fleet's step is one scope per key: the limiter grants the
        # first with room, and the call goes out with that key.
        keys = {scope_name(spec.provider, spec.model, k.id): k for k in self.pool}
        fleet = [(s, k.limit) for s, k in keys.items()] or [(self.scope, self.limit)]
        refused: dict[str, str] = {}  # key id -> the provider's words
        scopes: list[tuple[list[tuple[str, Limit]], Share | None]] = []
        if self.batch_limit:
            scopes.append(([(self.batch_scope, self.batch_limit)], None))
        scopes.append((fleet, self.share))
        for _ in range(MAX_RATE_LIMITED):
            slots: list[Slot] = []
            try:
                async with AsyncExitStack() as held:
                    for options, share in scopes:
                        try:
                            slots.append(await held.enter_async_context(hold_any(
                                rt.limiter, options, tokens, holder=holder,
                                hold_for=SLOT_HOLD, max_wait=rt.max_wait, share=share,
                            )))  # fmt: skip
                        except CapacityTimeout:
                            # Nothing was sent: the tokens the batch's scope took are
                            # given back (its slot is released on leaving the stack).
                            await _charge(slots, 0)
                            raise
                    paying = slots[-1].scope  # the fleet's scope granted: the key's
                    self.use_key(keys.get(paying))
                    try:
                        done = await self.send(user)
                    except RateLimited as exc:
                        # The provider's own count disagrees with ours (another client on
                        # the key, a lower tier): everyone waits, not only this worker.
                        # A pool's key is paused alone: the next try goes to another.
                        await _charge(slots, 0)  # a refusal is charged nothing
                        await rt.limiter.pause(paying, _pause_for(exc))
                        continue
                    except KeyRefused as exc:
                        # Refused before generating (not billed): the fleet passes the key
                        # over for a while, and this call goes to another key of the pool.
                        await _charge(slots, 0)
                        await rt.limiter.pause(paying, KEY_REFUSED_PAUSE, rate_limited=False)
                        refused[exc.key_id] = exc.reason
                        log.warning("key %s of the pool was refused: %s", exc.key_id, exc.reason)
                        fleet[:] = [(s, lim) for s, lim in fleet if keys[s].id not in refused]
                        if not fleet:
                            raise await self.all_refused(refused) from None
                        continue
                    except (Snooze, BatchCancelled, ModelUnavailable):  # nothing was sent or billed
                        await _charge(slots, 0)
                        raise
                    # What the provider's limiter counted: the input it reports, and the
                    # max output the request named (OpenAI counts max_tokens up front,
                    # whatever the answer), else the output reported.
                    out = most if named else done.usage.output_tokens
                    await _charge(slots, done.usage.input_tokens + out)
                    return done
            except CapacityTimeout as exc:
                raise Snooze(str(exc), after=max(1.0, exc.retry_in)) from None
            except InvalidInput as exc:  # a call larger than its limit can ever allow
                raise Fatal(str(exc)) from None
        raise Snooze(
            f"{self.scope}: the provider answered 429 {MAX_RATE_LIMITED} times in a row",
            after=DEFAULT_PAUSE * MAX_RATE_LIMITED,
        )

    async def all_refused(self, refused: dict[str, str]) -> Exception:
        """Every key of the pool refused: the batch parks (as one key's refusal parks
        it), naming the keys by their ids; a call of no batch fails."""
        ids = ", ".join(sorted(refused))
        reason = f"every key of the pool was refused ({ids}): {next(iter(refused.values()))}"
        if self.batch is None:
            return Fatal(reason)
        return await park(self.ctx.app, self.rt.store, self.batch, self.ctx.job_id, "refused",
                          reason)  # fmt: skip

    def use_key(self, key: PoolKey | None) -> None:
        """Send the next call with ``key`` of the pool (None: the process's key)."""
        if key is None:
            return
        self.key_id = key.id
        self.provider = self.rt.provider(self.spec, limited=True, failover=self.failover, key=key)

    async def send(self, user: str) -> Completion:
        rt, spec, ctx, batch = self.rt, self.spec, self.ctx, self.batch
        await ctx.check_lease()  # a worker resumed after a pause pays for nothing
        estimate, most = reservation_tokens(spec, user, default_max=rt.max_tokens)
        try:
            call_id = await self.open_call(estimate, self.priced(estimate, most))
        except OverBudget:
            assert batch is not None
            raise await park(
                ctx.app, rt.store, batch, ctx.job_id, "budget", "its budget is spent"
            ) from None
        with telemetry.model_call(spec.provider, spec.model) as span:
            try:
                done = await self.provider.complete(
                    spec.system, user, schema=spec.schema, params=spec.params
                )
            except asyncio.CancelledError:
                # The lease was lost (or the worker stops) mid-call: the request is
                # aborted, but the provider may bill what it generated meanwhile.
                await asyncio.shield(rt.store.close_call(call_id, "lost"))
                raise
            except RateLimited as exc:
                await rt.store.close_call(call_id, None)  # refused before generating: not billed
                if self.fallback_after is not None and _pause_for(exc) > self.fallback_after:
                    raise ModelUnavailable(f"paused {_pause_for(exc):g} s by a 429") from None
                if self.limit:
                    raise
                # Capacity, not the job, is at fault: handed back with no attempt counted.
                raise Snooze(str(exc), after=_pause_for(exc) * (1 + random.random())) from None
            except ProviderError as exc:
                await rt.store.close_call(call_id, sent_kind(exc))
                down = fallback.unavailable(exc)
                if self.fallback_after is not None and down is not None:
                    raise ModelUnavailable(down) from None
                if isinstance(exc, ProviderAuthError) and self.pooled:
                    raise KeyRefused(self.key_id, str(exc)) from None
                reason = refusal(exc)
                if reason is not None and batch is not None:
                    raise await park(
                        ctx.app, rt.store, batch, ctx.job_id, "refused", reason
                    ) from None
                raise
            except BaseException:
                await rt.store.close_call(call_id, "failed")
                raise
            cost = rt.prices.cost_of(spec.model, done.usage, spec.provider)
            span.answered(done, cost)
        # Closed as 'call' once the answer is in the exact cache (settle): a run that
        # dies between the two leaves the row open, closed 'cut_short' by the run that
        # takes over, which finds the answer stored. Closed first, a death before the
        # store would leave a paid call whose answer is lost, and the next run pays again.
        self.paid.append((call_id, {
            "i": done.usage.input_tokens, "o": done.usage.output_tokens, "cost": cost,
            "cached": done.usage.cached_input_tokens, "written": done.usage.cache_write_tokens,
            "provider_saved": None if self.price is None else self.price.cache_saved(done.usage),
        }))  # fmt: skip
        return done

    async def settle(self, *, failing: bool = False) -> None:
        """Close the ledger rows of the calls this run was answered by (see send), through
        a short outage of the store. A row still not closed fails the run, whose next run
        closes it 'cut_short' (and finds the answer stored); while this run fails anyway
        (``failing``), its own error stands and the row is left to that next run."""
        while self.paid:
            call_id, usage = self.paid[0]
            try:
                await aio.through_outage(
                    partial(self.rt.store.close_call, call_id, "call", **usage),
                    f"ledger row {call_id}",
                )
            except BrokerError as exc:
                if not failing:
                    raise
                log.warning("ledger row %d left open: %s", call_id, exc)
                return
            self.paid.pop(0)

    async def compute(self, document: str) -> JSON:
        spec = self.spec
        first = await self.call(document)
        value, error = validate_answer(first.text, spec.schema)
        if error is None:
            return {"output": value, "model": first.model}
        second = await self.call(REPAIR.format(document=document, answer=first.text, error=error))
        value, error2 = validate_answer(second.text, spec.schema)
        if error2 is None:
            return {"output": value, "model": second.model, "repaired": True}
        raise Fatal(
            f"invalid model output after one repair: {error2}; raw output: {second.text[:2000]}"
        )


async def _charge(slots: list[Slot], tokens: int) -> None:
    for slot in slots:
        await slot.adjust(tokens)


def _pause_for(exc: RateLimited) -> float:
    return exc.retry_after if exc.retry_after is not None else DEFAULT_PAUSE


async def answer(
    rt: EvalRuntime,
    ctx: JobContext,
    payload: dict[str, Any],
    spec: EvalSpec,
    document: str,
    fallbacks: Sequence[str],
) -> tuple[Lookup, int, EvalSpec, str]:
    """``document`` answered through the exact cache by ``spec``'s model, or by the first
    of its ``fallbacks`` available while it is not; returns the answer, the rank of the
    model that gave it (0: the spec's own), that model's spec and its key. A one-prompt
    evaluation and a pipeline's stage call alike. BatchCancelled: the batch was."""
    key, batch = payload["key"], payload.get("batch")
    # The batch's model, then its fallbacks in order: a model found unavailable is passed
    # over for a while (fallback.Breaker); each answer is cached under its own model's key.
    try:
        chain = [spec, *fallback.specs(spec, fallbacks)]
    except InvalidInput as exc:  # a provider this process does not know (any more)
        raise Fatal(f"fallbacks: {exc}") from None
    breaker = fallback.breaker_of(ctx.app)
    for n, model_spec in enumerate(chain):
        last = n == len(chain) - 1
        model_key = key if n == 0 else model_spec.key(document)
        run = Evaluation(rt, ctx, {**payload, "key": model_key}, model_spec)
        if not last:
            run.fall_back_after(float(ctx.app.settings.fallback_after))
            if not breaker.available(model_spec) and await rt.cache.get(model_key) is None:
                continue
        await run.limited()
        try:
            # Owned by the job, not the process: a run that takes this job over from a
            # worker that died mid-call takes its lock on the key at once, rather than
            # waiting out the lock's ttl (HERD_EVAL_LOCK_TTL) for a holder that is gone.
            found = await rt.cache.get_or_compute(
                model_key, partial(run.compute, document), owner=f"herd-job:{ctx.job_id}"
            )
        except ModelUnavailable as exc:
            await asyncio.shield(run.settle(failing=True))
            breaker.trip(model_spec, exc.reason)
            continue
        except BaseException:
            # Also when the lease was lost meanwhile: no paid call is left open.
            await asyncio.shield(run.settle(failing=True))
            raise
        await run.settle()  # the answer is stored: the calls it cost are closed now
        if found.source == "computed":
            breaker.recovered(model_spec)
        break
    telemetry.model_served(model_spec.provider, model_spec.model, found.source)
    if found.source in ("hit", "waited", "stale"):
        kind = "singleflight" if found.source == "waited" else "cache"
        await rt.store.record(batch=batch, job_id=ctx.job_id, key=model_key, kind=kind,
                              model=model_spec.model, provider=model_spec.provider)  # fmt: skip
    return found, n, model_spec, model_key


async def evaluate(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The built-in evaluation task (registered in herd.builtin)."""
    rt = await EvalRuntime.of(ctx.app)
    # Running, it is not dead: requeued from the dead letters, or its death refused.
    await rt.store.job_running(ctx.job_id)
    try:
        return await _evaluate(rt, payload, ctx)
    except (Snooze, LeaseLost):
        raise
    except Exception as exc:
        lease = ctx.lease
        if isinstance(exc, Fatal) or lease.attempts + 1 >= lease.max_attempts:
            # Dead-lettered next (the worker's rule): status counts its items dead from
            # here, not from a fetch of every waiting item's job.
            await rt.store.job_failed(ctx.job_id, payload["key"])
        raise


async def _evaluate(rt: EvalRuntime, payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    key = payload["key"]
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
    try:
        found, n, model_spec, model_key = await answer(
            rt, ctx, payload, spec, document, payload.get("fallbacks") or []
        )
    except BatchCancelled:
        await rt.store.cancel_job_items(ctx.job_id)
        return {"key": key, "path": payload.get("path"), "cancelled": True}
    result = {"key": key, "path": payload.get("path"), "source": found.source, **dict(found.value)}
    if n:  # answered by a fallback: its model is in the answer, its provider and rank here
        result.update(provider=model_spec.provider, fallback=n, answered_key=model_key)
    async with fenced(ctx, rt.store) as conn:  # lands only while this job's lease holds
        # Under the join lock: items stored after this end take the answer kept here.
        await EvalStore.on(conn, "job_join_lock", job=ctx.job_id)
        await EvalStore.on(conn, "job_done", source=found.source, result=Jsonb(result),
                           job=ctx.job_id, key=key)  # fmt: skip
        await EvalStore.on(conn, "job_answer", source=found.source, result=Jsonb(result),
                           job=ctx.job_id, key=key)  # fmt: skip
    return result


def _held_by_calls_in_flight(batch_row: Sequence[Any], worst: Decimal | None) -> bool:
    """Whether a refused reservation fits the budget once the calls in flight settle:
    the budget is not spent, only held by their worst cases, so the batch must not park
    (a budget of one worst case, with two workers, parked with 0 % of it spent)."""
    budget, spent, _reserved, parked = batch_row[:4]
    if parked is not None or budget is None or worst is None:
        return False
    return bool(spent + worst <= budget)
