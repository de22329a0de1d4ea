"""The semantic query cache: an answer for a query close enough to one already answered.

    cache = SemanticCache("postgresql://…", embedder=minilm_embedder())  # or redis://
    async with cache:
        hit = await cache.alookup("What does Pasal 5 say about wages?", collection="uu")
        if hit is None:
            ...
        found = await cache.aget_or_compute(query, retrieve, collection="uu", generation="7")
        found.value, found.source, found.similarity

A hit needs three things: the same scope (tenant, embedder, collection and
generation, filtered inside the KNN query), a cosine similarity of at least the
threshold (computed in float64 from the stored vector, so a boundary means what
it says), and agreeing near-miss guards (herd.semantic.guards). Misses go through
herd's ExactCache policy keyed on the normalized query: one caller computes
under a fenced lock while identical callers wait for it or get a stale value,
with XFetch early refresh; this module only adapts the semantic lookup to it.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import hashlib
import math
import random
import time
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from herd.cache.base import Entry
from herd.cache.exact import ExactCache
from herd.config import SEMANTIC_MAX_ENTRY_BYTES
from herd.errors import ConfigError
from herd.jsonvalue import JSON, dumps
from herd.locks.base import BaseLocks
from herd.names import MAX_NAME_LENGTH, check_name
from herd.portal import Portal
from herd.semantic import bounded
from herd.semantic import stats as figures
from herd.semantic.base import (
    NEVER,
    Candidate,
    NewEntry,
    Scope,
    SemanticStore,
    Vector,
    as_vector,
    similarities,
)
from herd.semantic.guards import Signature, signature
from herd.semantic.stores import store_for_url

Source = Literal["hit", "waited", "computed", "stale", "early"]
# The index scores in float32: a candidate whose index similarity is this far below
# the threshold cannot reach it in float64, so it is not even decoded.
FLOAT32_SLACK = 1e-4
# Chosen by cross-validation over three labelled sets and two embedders, each set held
# out in turn (bench/semantic_defaults.py): the lowest cosine at which, with the guards,
# no set served more than 2% of its near misses. 0.95 before: fewer hits, no fewer wrong.
DEFAULT_THRESHOLD = 0.94
FLUSH_EVERY = 1.0  # seconds between flushes of figures and last-use times to the backend
POOL_EVERY = 10.0  # seconds between reads of the bounded mode's pooled verdicts
_LAYER = "semantic/"  # the namespace prefix of the exact cache in front of a semantic one


@dataclass(frozen=True)
class SemanticHit:
    value: JSON
    similarity: float  # cosine similarity to the cached query (1.0 when computed here)
    query: str  # the cached query that answered
    source: Source  # as ExactCache's Lookup: hit, waited, computed, stale or early
    created_at: float
    expires_at: float | None  # server time; None: never
    entry: str | None = None  # the cached entry that answered (for ``areport``)
    guards_agree: bool = True  # whether the near-miss guards agreed (bounded mode: a feature)


@dataclass
class _Request:
    cache: str
    scope: Scope
    query: str
    vector: Vector
    threshold: float
    found: tuple[Candidate, float] | None = None
    observed: bool = False
    agree: bool = True  # the guards' verdict on ``found``
    recheck: bool = False  # bounded mode: compute even if a hit is served, and compare
    # bounded mode: the nearest candidate not served (or rechecked), whose answer the
    # computation will judge: (candidate, similarity, guards agree)
    probe: tuple[Candidate, float, bool] | None = None

    # Computed on first use: a miss by similarity alone never needs either.
    @functools.cached_property
    def key(self) -> str:
        """The singleflight key and entry id: one per normalized query in a scope."""
        parts = [self.cache, *self.scope.tags().values(), normalize_query(self.query)]
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()

    @functools.cached_property
    def guard(self) -> Signature:
        return signature(self.query)


_current: contextvars.ContextVar[_Request] = contextvars.ContextVar("herd_semantic_request")


def normalize_query(query: str) -> str:
    """The singleflight key's text: case, width and spacing do not make another question."""
    return " ".join(unicodedata.normalize("NFKC", query).casefold().split())


def check_threshold(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError(f"threshold is a cosine similarity in [0, 1], not {value!r}")
    return float(value)


class SemanticCache:
    def __init__(
        self,
        backend: SemanticStore | str,
        *,
        embedder: Any = None,
        embedder_id: str | None = None,
        dim: int | None = None,
        locks: BaseLocks | None = None,
        name: str = "default",
        tenant: str = "default",
        threshold: float | None = None,
        guards: bool = True,
        mode: str = "guarded",
        error_bound: float = 0.05,
        recheck: float = 0.05,
        same: Callable[[JSON, JSON], bool] | None = None,
        k: int = 5,
        ttl: float | None = 3600.0,
        sliding: bool = False,
        max_entries: int = 100_000,
        max_entry_bytes: int | None = SEMANTIC_MAX_ENTRY_BYTES,
        xfetch_beta: float | None = 1.0,
        stale_while_revalidate: float = 0.0,
        lock_ttl: float = 30.0,
        wait: float = 30.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """
        backend: a SemanticStore, or a URL (redis:// for Redis Stack, postgresql:// for pgvector).
        embedder: turns queries into vectors (herd.rag.embedders); without one, pass vector=.
        embedder_id, dim: taken from the embedder unless given.
        name: the cache's name; max_entries bounds each name (least recently used go first).
        tenant: the default tenant of lookups and stores.
        threshold: the least cosine similarity of a hit, in [0, 1] (default 0.94; in
            the bounded mode, the least similarity considered, default 0.8).
        guards: require the near-miss guards to agree (negation, numbers, names, scope,
            relation words, word order); in the bounded mode their verdict is a feature.
        mode: "guarded" (a fixed threshold and the guards) or "bounded" (herd.semantic.
            bounded: serve a neighbour only while the learned chance that its answer
            is wrong is at most ``error_bound``).
        error_bound: δ of the bounded mode, a probability in (0, 1).
        recheck: bounded mode: the share of served hits that ``aget_or_compute``
            computes anyway to check them (the caller gets the fresh answer).
        same: bounded mode: whether two answers agree (default ==), for its checks.
        k: candidates fetched per lookup; the best one that passes the guards answers.
        ttl: seconds an entry is fresh (None: until evicted); sliding: a hit renews it.
        max_entry_bytes: the largest answer kept (its JSON's bytes; None: any); a larger
            one is returned, not stored, and counted ``too_large``.
        xfetch_beta, stale_while_revalidate, lock_ttl, wait: as ExactCache.
        clock: epoch seconds (for tests); default: the server's clock.
        """
        self.mode = bounded.check_mode(mode)
        self.bounded = self.mode == "bounded"
        self.error_bound = bounded.check_bound(error_bound)
        self.recheck = bounded.check_recheck(recheck)
        self.same = same or (lambda a, b: a == b)
        if threshold is None:
            threshold = bounded.BOUNDED_FLOOR if self.bounded else DEFAULT_THRESHOLD
        self.threshold = check_threshold(threshold)
        if not (isinstance(k, int) and 1 <= k <= 100):
            raise ConfigError(f"k must be an integer from 1 to 100, not {k!r}")
        if not (isinstance(max_entries, int) and max_entries >= 1):
            raise ConfigError(f"max_entries must be a positive integer, not {max_entries!r}")
        if ttl is not None and not (math.isfinite(ttl) and ttl > 0):
            raise ConfigError(f"ttl must be a positive number of seconds or None, not {ttl!r}")
        if max_entry_bytes is not None and not (
            isinstance(max_entry_bytes, int) and max_entry_bytes >= 1
        ):
            raise ConfigError(
                f"max_entry_bytes must be a positive integer or None, not {max_entry_bytes!r}"
            )
        if sliding and ttl is None:
            raise ConfigError("a sliding ttl needs a ttl")
        # Room for the "semantic/" of its exact layer's namespace.
        check_name(name, "semantic cache name", "name", max_length=MAX_NAME_LENGTH - len(_LAYER))
        self.backend = store_for_url(backend) if isinstance(backend, str) else backend
        self.locks = locks if locks is not None else self.backend.locks()
        self.embedder = embedder
        self.embedder_id = embedder_id or (embedder.id if embedder is not None else None)
        self.dim = dim or (embedder.dim if embedder is not None else None)
        if not self.embedder_id or not self.dim:
            raise ConfigError("give an embedder, or embedder_id and dim")
        self.name, self.tenant, self.guards, self.k = name, tenant, guards, k
        self.ttl, self.sliding, self.max_entries = ttl, sliding, max_entries
        self.max_entry_bytes = max_entry_bytes
        self.swr = stale_while_revalidate
        self._clock = clock
        self._offset = 0.0
        self._policy = ExactCache(
            _Bridge(self),
            self.locks,
            namespace=_LAYER + name,
            ttl=ttl,
            xfetch_beta=xfetch_beta,
            stale_while_revalidate=stale_while_revalidate,
            lock_ttl=lock_ttl,
            wait=wait,
        )
        self._buffer = figures.Buffer()
        self._used: dict[str, float] = {}
        # Identical searches in flight in this process, shared: a stampede of callers of
        # one question costs one search per round, not one pooled connection each (200
        # callers queued past the pool's timeout on a loaded machine).
        self._searches: dict[tuple[Any, ...], asyncio.Future[Any]] = {}
        self._flushed = time.monotonic()
        self._flushing = False
        self._portal: Portal | None = None
        self._pool = bounded.Pool()
        self._pool_read = -math.inf
        self._random = random.Random()
        self._opened = False
        self._opening = asyncio.Lock()

    # -- life

    async def open(self) -> Self:
        assert self.dim is not None
        await self.backend.open(self.dim)
        await self.locks.open()
        if self._clock is None:
            self._offset = await self.backend.server_time() - time.time()
        self._opened = True
        if self.bounded:
            await self._read_pool()
        return self

    async def _ensure_open(self) -> None:
        # Opened on first use too, so that a cache made in a script just works;
        # ``with`` / ``async with`` also closes it.
        if not self._opened:
            async with self._opening:
                if not self._opened:
                    await self.open()

    async def close(self) -> None:
        await self._policy.drain()
        await self.flush()
        await self.locks.close()
        await self.backend.close()
        self._opened = False

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __enter__(self) -> Self:
        self._sync(self.open())
        return self

    def __exit__(self, *exc: object) -> None:
        self._sync(self.close())
        if self._portal is not None:
            self._portal.stop()
            self._portal = None

    def _sync(self, coro: Any) -> Any:
        if self._portal is None:
            # A script that never closes the cache: close it at exit, in its own loop.
            self._portal = Portal(f"herd-semantic-{self.name}", on_exit=self._close_if_open)
        return self._portal.call(coro)

    async def _close_if_open(self) -> None:
        if self._opened:
            await self.close()

    def now(self) -> float:
        return self._clock() if self._clock is not None else time.time() + self._offset

    # -- the API

    async def alookup(
        self,
        query: str,
        *,
        vector: Any = None,
        tenant: str | None = None,
        collection: str = "",
        generation: str | int = "",
        threshold: float | None = None,
    ) -> SemanticHit | None:
        """The best cached answer for ``query`` in its scope, or None."""
        req = await self._request(query, vector, tenant, collection, generation, threshold)
        found = await self._find(req, stale_for=0.0)
        self._buffer.count("hits" if found else "misses")
        await self._maybe_flush()
        return self._hit(req, found, "hit") if found else None

    async def astore(
        self,
        query: str,
        value: JSON,
        *,
        vector: Any = None,
        tenant: str | None = None,
        collection: str = "",
        generation: str | int = "",
        delta: float = 0.0,
    ) -> str:
        """Cache ``value`` as the answer to ``query``; returns the entry's id."""
        req = await self._request(query, vector, tenant, collection, generation, None)
        await self._put(req, value, delta=delta)
        return req.key

    async def aget_or_compute(
        self,
        query: str,
        compute: Callable[[], Awaitable[JSON]],
        *,
        vector: Any = None,
        tenant: str | None = None,
        collection: str = "",
        generation: str | int = "",
        threshold: float | None = None,
    ) -> SemanticHit:
        """A cached answer, or ``compute()``'s, computed once for concurrent identical misses."""
        req = await self._request(query, vector, tenant, collection, generation, threshold)
        # Only here: a recheck needs the computation that alookup does not have.
        req.recheck = self.bounded and self.recheck > 0 and self._random.random() < self.recheck
        token = _current.set(req)
        try:
            found = await self._policy.get_or_compute(req.key, compute)
        finally:
            _current.reset(token)
        await self._maybe_flush()
        if found.source in ("computed", "early") or req.found is None:
            now = self.now()
            expires = now + self.ttl if self.ttl is not None else None
            return SemanticHit(found.value, 1.0, query, found.source, now, expires)
        return self._hit(req, req.found, found.source, value=found.value)

    async def areport(self, hit: SemanticHit, *, correct: bool) -> None:
        """Tell the bounded mode whether a hit it served was right (any mode records it)."""
        if hit.entry is None:
            raise ConfigError("report on a hit served from the cache, not a computed answer")
        await self._ensure_open()
        await self._judge(hit.entry, hit.similarity, hit.guards_agree, correct)

    async def aclear(self, *, collection: str | None = None, all_caches: bool = False) -> int:
        await self._ensure_open()
        return await self.backend.clear(None if all_caches else self.name, collection)

    async def astats(self) -> dict[str, Any]:
        """This cache's figures: counters, hit rate, histograms (see herd.semantic.stats)."""
        await self._ensure_open()
        await self.flush()
        raw = (await self.backend.read_stats()).get(self.name, {})
        return figures.summarize(raw)

    async def adrain(self) -> None:
        """Wait for background refreshes (stale-while-revalidate)."""
        await self._policy.drain()

    def lookup(self, query: str, **kw: Any) -> SemanticHit | None:
        result: SemanticHit | None = self._sync(self.alookup(query, **kw))
        return result

    def store(self, query: str, value: JSON, **kw: Any) -> str:
        result: str = self._sync(self.astore(query, value, **kw))
        return result

    def get_or_compute(self, query: str, compute: Callable[[], JSON], **kw: Any) -> SemanticHit:
        async def run() -> JSON:
            return await asyncio.to_thread(compute)

        result: SemanticHit = self._sync(self.aget_or_compute(query, run, **kw))
        return result

    def report(self, hit: SemanticHit, *, correct: bool) -> None:
        self._sync(self.areport(hit, correct=correct))

    def clear(self, **kw: Any) -> int:
        result: int = self._sync(self.aclear(**kw))
        return result

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._sync(self.astats())
        return result

    # -- the policy

    async def _request(
        self,
        query: str,
        vector: Any,
        tenant: str | None,
        collection: str,
        generation: str | int,
        threshold: float | None,
    ) -> _Request:
        await self._ensure_open()
        if vector is None:
            if self.embedder is None:
                raise ConfigError("this cache has no embedder: pass vector=")
            vector = (await self.embedder.aembed([query]))[0]
        vec = self.backend.quantize(as_vector(vector, self.dim))
        assert self.embedder_id is not None
        scope = Scope(tenant or self.tenant, self.embedder_id, collection, str(generation))
        req = _Request(
            self.name,
            scope,
            query,
            vec,
            self.threshold if threshold is None else check_threshold(threshold),
        )
        return req

    async def _search(self, req: _Request, *, alive_at: float) -> tuple[Any, Any]:
        """The backend's search, joined by identical searches that start before it ends
        (their answer can only be as old as the moment they asked)."""
        sig = (req.scope, req.vector.tobytes(), req.threshold, self.k)
        flight = self._searches.get(sig)
        if flight is None:
            flight = asyncio.ensure_future(
                self.backend.search(
                    self.name,
                    req.scope,
                    req.vector,
                    k=self.k,
                    alive_at=alive_at,
                    floor=req.threshold - FLOAT32_SLACK,
                )
            )
            self._searches[sig] = flight
            flight.add_done_callback(functools.partial(self._landed, sig))
        found: tuple[Any, Any] = await asyncio.shield(flight)
        return found

    def _landed(self, sig: tuple[Any, ...], flight: asyncio.Future[Any]) -> None:
        if self._searches.get(sig) is flight:
            del self._searches[sig]
        if not flight.cancelled():
            flight.exception()  # retrieved: every joiner re-raises it

    async def _find(self, req: _Request, *, stale_for: float) -> tuple[Candidate, float] | None:
        started = time.perf_counter()
        now = self.now()
        nearest, candidates = await self._search(req, alive_at=now - stale_for)
        self._buffer.count("lookups")
        self._buffer.observe(
            "lat", figures.LATENCY_BUCKETS, time.perf_counter() - started, 1_000_000
        )
        scored = sorted(
            zip(similarities(req.vector, [c.vector for c in candidates]), candidates, strict=True),
            key=lambda sc: (sc[1].expires_at > now, sc[0]),
            reverse=True,
        )
        if not req.observed:  # once per request, however often singleflight looks again
            req.observed = True
            top = max([s for s, _ in scored] + [nearest or 0.0])
            top = min(max(top, 0.0), 1.0)  # the index's float32 can overshoot 1 by an ulp
            self._buffer.observe("sim", figures.SIMILARITY_BUCKETS, top, 1_000_000)
        above = [(s, c) for s, c in scored if s >= req.threshold]
        if self.bounded:
            chosen = await self._bounded_choice(req, above)
            if chosen is None:
                return None
            sim, best = chosen
        else:
            passing = [
                (s, c)
                for s, c in above
                if not self.guards or req.guard.agrees(Signature.from_json(c.guard))
            ]
            if above and not passing:
                self._buffer.count("guard_rejections")
            if not passing:
                return None
            sim, best = passing[0]
        self._used[best.id] = now
        if self.sliding and best.expires_at > now:
            assert self.ttl is not None
            moved = now + self.ttl
            await self.backend.touch(
                self.name, {best.id: now}, {best.id: (moved, self.swr)}, now=now
            )
            best = dataclasses.replace(best, expires_at=moved)
        req.found = (best, sim)
        return req.found

    async def _bounded_choice(
        self, req: _Request, above: list[tuple[float, Candidate]]
    ) -> tuple[float, Candidate] | None:
        """The first candidate whose chance of a wrong answer is within the bound; the
        nearest one not served becomes the request's probe, judged by the computation."""
        if time.monotonic() - self._pool_read >= POOL_EVERY:
            await self._read_pool()
        for sim, cand in above:
            if cand.id == req.key:  # the same query: an exact hit, not a guess
                req.agree = True
                return sim, cand
            agree = req.guard.agrees(Signature.from_json(cand.guard))
            risk = bounded.error_probability(
                self._pool, sim, agree, cand.verdicts, self.error_bound
            )
            if risk <= self.error_bound:
                if req.recheck:  # on every look of this request: singleflight looks twice
                    if req.probe is None:
                        req.probe = (cand, sim, agree)
                        self._buffer.count("rechecks")
                    return None
                req.agree = agree
                return sim, cand
            if req.probe is None:
                req.probe = (cand, sim, agree)
        return None

    async def _judge(self, entry: str, sim: float, agree: bool, correct: bool) -> None:
        await self.backend.judge(self.name, entry, sim, correct, keep=bounded.KEPT)
        self._pool.add(agree, sim, correct)
        self._buffer.add(bounded.counter(agree, sim, correct))
        self._buffer.count("verdicts_right" if correct else "verdicts_wrong")

    async def _judge_probe(self, req: _Request, value: JSON) -> None:
        if req.probe is None:
            return
        cand, sim, agree = req.probe
        req.probe = None
        await self._judge(cand.id, sim, agree, bool(self.same(value, cand.value)))

    async def _read_pool(self) -> None:
        self._pool_read = time.monotonic()
        await self.flush()
        raw = (await self.backend.read_stats()).get(self.name, {})
        self._pool = bounded.Pool.from_figures(raw)

    async def _put(self, req: _Request, value: JSON, *, delta: float) -> None:
        if self.max_entry_bytes is not None:
            size = len(dumps(value, what="semantic cache value").encode())
            if size > self.max_entry_bytes:
                self._buffer.count("too_large")
                return
        now = self.now()
        expires = now + self.ttl if self.ttl is not None else NEVER
        entry = NewEntry(
            req.key,
            req.scope,
            req.query,
            req.guard.to_json(),
            value,
            req.vector,
            delta,
            now,
            expires,
            self.swr,
        )
        evicted = await self.backend.put(self.name, entry, max_entries=self.max_entries, now=now)
        self._buffer.count("stores")
        if evicted:
            self._buffer.count("evictions", evicted)

    def _hit(
        self,
        req: _Request,
        found: tuple[Candidate, float],
        source: Source,
        value: JSON | None = None,
    ) -> SemanticHit:
        best, sim = found
        return SemanticHit(
            best.value if value is None else value,
            sim,
            best.query,
            source,
            best.created_at,
            None if best.expires_at >= NEVER else best.expires_at,
            best.id,
            req.agree,
        )

    async def _maybe_flush(self) -> None:
        if time.monotonic() - self._flushed >= FLUSH_EVERY:
            await self.flush()

    async def flush(self) -> None:
        """Send buffered figures and last-use times to the backend."""
        if self._flushing:
            return
        self._flushing = True
        try:
            self._flushed = time.monotonic()
            used, self._used = self._used, {}
            amounts = self._buffer.take()
            if used:
                await self.backend.touch(self.name, used)
            if amounts:
                await self.backend.add_stats(self.name, amounts)
        finally:
            self._flushing = False


@dataclass
class _Bridge:
    """ExactCache's store verbs over the semantic lookup of the request in progress.

    ExactCache keys by the normalized query; the bridge answers its ``get`` with
    the best semantic match for the request that the context variable carries
    (background refreshes inherit it), and its ``put`` stores that request.
    """

    cache: SemanticCache
    name: str = field(default="semantic")

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def get(self, namespace: str, key: str, *, stale_for: float = 0.0) -> Entry | None:
        req = _current.get()
        found = await self.cache._find(req, stale_for=stale_for)
        if found is None:
            return None
        best, _ = found
        expires = None if best.expires_at >= NEVER else best.expires_at
        return Entry(best.value, best.delta, best.created_at, expires, self.cache.now())

    async def put(
        self,
        namespace: str,
        key: str,
        value: JSON,
        *,
        delta: float,
        ttl: float | None,
        keep_stale: float = 0.0,
    ) -> None:
        req = _current.get()
        req.found = None  # what answers now is this computation, not an earlier match
        await self.cache._judge_probe(req, value)
        await self.cache._put(req, value, delta=delta)

    async def delete(self, namespace: str, key: str) -> None:
        return None

    async def clear(self, namespace: str | None = None) -> int:
        return await self.cache.aclear()

    async def count(self, amounts: dict[str, int], namespace: str) -> None:
        for name, n in amounts.items():
            self.cache._buffer.count(name, n)

    async def stats(self) -> dict[str, dict[str, int]]:
        return {self.cache.name: await self.cache.astats()}
