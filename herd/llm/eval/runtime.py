"""A process's resources for evaluations, opened on first use and closed with the app:
the store, the exact cache, prices, provider clients (from the provider registry),
and the fleet's limiter with the limits in force."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

from herd.app import App
from herd.cache import ExactCache
from herd.cache.stores import cache_stores
from herd.config import EVAL_MAX_TOKENS
from herd.errors import Fatal, InvalidInput
from herd.limits import Limit, Limiter, LimitsFile, PoolKey, limiter_for
from herd.limits import load as load_limits
from herd.limits.base import pooled
from herd.llm.eval.spec import EvalSpec, own_limits
from herd.llm.eval.store import EvalStore
from herd.llm.pricing import PriceTable
from herd.llm.providers import Provider, RetryPolicy, registry
from herd.llm.providers.batch import BatchAPI

# A batch's stored limits are read again after this long: a limit changed for a batch
# reaches every worker within it.
BATCH_LIMITS_TTL = 5.0
# Tries of a call whose batch has a fallback: one retry rides out a blip; past it the
# call moves to the fallback rather than back off for seconds more.
FAILOVER_TRIES = 2


def prices_in_force() -> PriceTable:
    """herd's price table, with HERD_PRICES's entries (a JSON file) over it."""
    prices = PriceTable.default()
    if os.environ.get("HERD_PRICES"):
        prices = prices.merged(PriceTable.from_file(os.environ["HERD_PRICES"]))
    return prices


@dataclass
class EvalRuntime:
    """A worker process's resources for evaluations, opened on first use."""

    store: EvalStore
    cache: ExactCache
    prices: PriceTable
    # (provider, model, limited, failover, the pool key's variable or "") -> client
    providers: dict[tuple[str, str, bool, bool, str], Provider] = field(default_factory=dict)
    # (provider, model, the pool key's variable or "") -> client
    batch_apis: dict[tuple[str, str, str], BatchAPI] = field(default_factory=dict)
    max_tokens: int = EVAL_MAX_TOKENS  # the setting eval_max_tokens
    # The fleet's provider limits, kept in the job store (None: a broker without one).
    limiter: Limiter | None = None
    limits_file: LimitsFile | None = None  # HERD_LIMITS
    max_wait: float = 30.0  # the setting limit_max_wait
    _batch_limits: dict[str, tuple[float, Limit, int]] = field(default_factory=dict)

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
        prices = prices_in_force()
        settings = app.settings
        store = EvalStore(url, ledger_ttl=settings.ledger_ttl, eval_ttl=settings.eval_ttl)
        limits_file = (
            load_limits(settings.limits_path, providers=registry.names())
            if settings.limits_path
            else None
        )
        try:
            limiter: Limiter | None = limiter_for(app.broker)
        except ValueError:  # a broker of a kind herd.limits has no store for
            limiter = None
        opened: list[Any] = []

        async def close() -> None:
            for provider in runtime.providers.values():
                await provider.aclose()
            for client in runtime.batch_apis.values():
                await client.aclose()
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

    def provider(
        self,
        spec: EvalSpec,
        *,
        limited: bool = False,
        failover: bool = False,
        key: PoolKey | None = None,
    ) -> Provider:
        """The spec's provider client; ``limited``: one that raises a 429 at once, for the
        fleet's limiter to pause the limit and decide when to try again; ``failover``:
        one that gives up on a 5xx after FAILOVER_TRIES, for a batch with a fallback
        (herd.llm.eval.fallback) to move on rather than wait out the backoff; ``key``:
        one that calls with that key of a pool (None: the provider's own variable's)."""
        ident = (spec.provider, spec.model, limited, failover, key.variable if key else "")
        found = self.providers.get(ident)
        if found is None:
            retry = (
                RetryPolicy(
                    max_tries=FAILOVER_TRIES if failover else RetryPolicy.max_tries,
                    retry_rate_limited=not limited,
                )
                if limited or failover
                else None
            )
            try:
                kind = registry.kind(spec.provider)
            except InvalidInput as exc:
                raise Fatal(str(exc)) from None
            secret = None
            if key is not None:
                secret = os.environ.get(key.variable)
                if not secret:  # it was set when HERD_LIMITS was read
                    raise Fatal(f"{key.variable} (a key of the pool in HERD_LIMITS) is not set")
            found = kind.sync(spec.model, self.max_tokens, retry, secret)
            self.providers[ident] = found
        return found

    def pool(self, spec: EvalSpec) -> tuple[PoolKey, ...]:
        """The keys of HERD_LIMITS's pool for the spec's provider and model, each with its
        own limit; () when none (the provider's one key is used)."""
        if self.limits_file is None:
            return ()
        return self.limits_file.pool_for(spec.provider, spec.model)

    def batch_api(self, spec: EvalSpec, variable: str | None = None) -> BatchAPI:
        """The spec's Batch API client, one per process, (provider, model) and key:
        ``variable`` names the pool key its provider batches are made with (None: the
        provider's own variable's)."""
        ident = (spec.provider, spec.model, variable or "")
        found = self.batch_apis.get(ident)
        if found is None:
            make = registry.kind(spec.provider).batch
            if make is None:
                raise Fatal(f"the {spec.provider} Batch API is not supported yet")
            secret = None
            if variable is not None:
                secret = os.environ.get(variable)
                if not secret:  # the batch was made with it: no other key can reach it
                    raise Fatal(f"{variable} (the key this batch's provider batches were"
                                " made with) is not set")  # fmt: skip
            found = self.batch_apis[ident] = make(spec.model, secret)
        return found

    def pool_variables(self, spec: EvalSpec) -> list[str]:
        """The variables of the pool's keys, in the file's order ([] without a pool): the
        keys a chunk's provider batch may be made with (queries.sql, record_handle)."""
        return [k.variable for k in self.pool(spec)]

    def most_output(self, spec: EvalSpec, asked: int | None) -> tuple[int, bool]:
        """The most output tokens a call asks for, and whether the request names it: its
        params' max, else what the provider's client sends by itself (Anthropic's
        max_tokens), else the setting HERD_EVAL_MAX_TOKENS (not named)."""
        if asked is not None:
            return asked, True
        own = registry.kind(spec.provider).default_max_tokens
        if own:
            return min(own, self.max_tokens), True
        return self.max_tokens, False

    def limit_for(self, spec: EvalSpec, key: str) -> Limit:
        """The fleet's limit of a call of ``spec`` under API key id ``key``: HERD_LIMITS's
        entry alone (a batch's own limit is a scope of its own: ``batch_limit``)."""
        if self.limits_file is None:
            return Limit()
        return self.limits_file.limit_for(spec.provider, spec.model, key)

    def fleet_limit(self, spec: EvalSpec) -> Limit:
        """What HERD_LIMITS allows the spec's calls taken together: a pool's keys' limits
        added up (each key has its own), else the limit of the provider's one key. For a
        plan's time at the limits; a call is held under its key's own."""
        keys = self.pool(spec)
        if keys:
            return pooled([k.limit for k in keys])
        return self.limit_for(spec, self.provider(spec).key_id)

    async def batch_limit(self, batch: str | None) -> Limit:
        """The batch's own limits (rpm, tpm, max_concurrent), read again after
        BATCH_LIMITS_TTL; an empty Limit for none."""
        return (await self._batch_row(batch))[1]

    async def batch_weight(self, batch: str | None) -> int:
        """The batch's weight in the fair share of the fleet's limits (1: not given)."""
        return (await self._batch_row(batch))[2]

    async def _batch_row(self, batch: str | None) -> tuple[float, Limit, int]:
        if batch is None:
            return (0.0, Limit(), 1)
        now = time.monotonic()
        cached = self._batch_limits.get(batch)
        if cached is None or now - cached[0] > BATCH_LIMITS_TTL:
            row = await self.store.batch(batch)
            stored, weight = own_limits(row.get("limits") if row else None)
            try:
                own = Limit.from_json(stored, where=f"batch {batch!r} limits")
            except InvalidInput as exc:
                raise Fatal(str(exc)) from None
            if len(self._batch_limits) > 1000:  # bounded: batches come and go
                self._batch_limits.clear()
            cached = self._batch_limits[batch] = (now, own, weight)
        return cached
