"""LangChain caches on herd: ``set_llm_cache(HerdCache())`` or ``HerdSemanticCache()``.

    pip install 'herd[langchain]'
    from langchain_core.globals import set_llm_cache
    from herd.integrations.langchain import HerdCache
    set_llm_cache(HerdCache())  # HERD_DATABASE_URL / HERD_CACHE, as App() reads them

HerdCache is herd's exact cache. A key is SHA-256 over canonical JSON of the
prompt and the model's settings (LangChain's ``llm_string``); a value is
LangChain's own JSON form of the generations (``dumpd``), read back by ``load``
restricted to langchain-core's classes, never pickle.

It adds the singleflight that LangChain's lookup-then-update interface lacks: a
lookup that misses takes the key's fenced lock (herd.locks) and returns None, so
its caller calls the model; identical lookups anywhere, in this process or any
other, wait for that lock and read what the holder's ``update`` publishes. A
holder that never updates (its model call raised) must not keep the key: its
lock is renewed only while the thread or task that looked up is alive, and for
``max_hold`` seconds at most; the same caller looking up again (a retry) calls
the model again instead of waiting for itself; a holder process that dies lets
the lock expire within ``lock_ttl``. A caller that has waited ``wait`` seconds
calls the model itself rather than fail.

HerdSemanticCache answers a prompt close enough to one already answered
(herd.SemanticCache: cosine threshold and near-miss guards for numbers,
negations, names), for the same model settings and the same earlier messages.

Both construct with no arguments from the settings, and do their I/O on an event
loop of their own (herd.portal), so that the sync and async methods share one set
of connections whatever thread or loop calls them; it is closed at exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from herd import aio
from herd.app import App
from herd.cache.stores import open_cache_stores
from herd.config import Settings
from herd.errors import ConfigError, HerdError
from herd.jsonvalue import JSON, canonical
from herd.locks.base import LockLease
from herd.portal import PortalBacked
from herd.semantic.cache import DEFAULT_THRESHOLD

try:
    from langchain_core.caches import RETURN_VAL_TYPE, BaseCache
    from langchain_core.load import dumpd, load
except ImportError as exc:  # the optional extra
    raise ImportError(
        f"herd.integrations.langchain needs langchain-core: pip install 'herd[langchain]' ({exc})"
    ) from exc

T = TypeVar("T")

log = logging.getLogger("herd.cache")

KEY_VERSION = 1  # bump when the key's recipe changes, so old entries stop matching
NAMESPACE = "langchain"
ALIVE_EVERY = 0.5  # seconds between checks that a claim's caller still runs
MAX_HOLD = 300.0
WAIT = 300.0


def cache_key(prompt: str, llm_string: str) -> str:
    """sha256 over canonical JSON of the prompt and the model's settings."""
    doc = {"v": KEY_VERSION, "prompt": prompt, "llm": llm_string}
    return hashlib.sha256(canonical(doc).encode()).hexdigest()


def to_json(generations: RETURN_VAL_TYPE) -> JSON:
    out: JSON = [dumpd(g) for g in generations]
    return out


def from_json(value: JSON) -> RETURN_VAL_TYPE:
    if not isinstance(value, list):
        raise HerdError(f"a LangChain cache entry is a list of generations, not {value!r:.80}")
    # "core": only langchain-core's own classes are built from stored data.
    return [load(item, allowed_objects="core") for item in value]


def _seconds(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{name} must be a positive number of seconds, not {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{name} must be finite, not {value!r}")
    return float(value)


@dataclass(eq=False)
class _Claim:
    """A key's lock, held by the caller (thread or task) that will call the model."""

    lease: LockLease
    owner: object
    alive: Callable[[], bool]
    started: float = field(default_factory=time.monotonic)
    keeper: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)  # set once it is let go


def _this_caller() -> tuple[object, Callable[[], bool]]:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop: a plain thread
        task = None
    if task is not None:
        return task, lambda: not task.done()
    thread = threading.current_thread()
    return thread, thread.is_alive


class HerdCache(PortalBacked, BaseCache):
    """LangChain's ``BaseCache`` over herd's exact cache, with cross-process singleflight."""

    def __init__(
        self,
        *,
        settings: Settings | None = None,
        namespace: str = NAMESPACE,
        ttl: float | None = None,
        lock_ttl: float | None = None,
        max_hold: float = MAX_HOLD,
        wait: float = WAIT,
        poll_interval: float = 0.2,
    ) -> None:
        """
        settings: where the cache lives (default: the environment, as ``App()``):
            HERD_CACHE=redis puts it on HERD_REDIS_URL, else herd's PostgreSQL.
        ttl: seconds an entry is fresh (default: HERD_CACHE_TTL; 0 there: forever).
        lock_ttl: seconds a dead holder's lock blocks its key (default: HERD_EVAL_LOCK_TTL).
        max_hold: the longest a holder's model call keeps others waiting.
        wait: the longest a caller waits for another's model call before calling itself.
        """
        super().__init__(f"herd-langchain-{namespace}")
        self.settings = settings or Settings.from_env()
        if not namespace or "{" in namespace or "}" in namespace or len(namespace) > 200:
            raise ConfigError(
                f"namespace must be 1 to 200 characters without braces: {namespace!r}"
            )
        self.namespace = namespace
        self.ttl = _seconds(ttl, "ttl") if ttl is not None else (self.settings.cache_ttl or None)
        self.lock_ttl = _seconds(
            lock_ttl if lock_ttl is not None else self.settings.eval_lock_ttl, "lock_ttl"
        )
        self.max_hold = _seconds(max_hold, "max_hold")
        self.wait = _seconds(wait, "wait")
        self.poll_interval = _seconds(poll_interval, "poll_interval")
        # Touched on the portal's loop only. A gate lives while a caller holds it.
        self._claims: dict[str, _Claim] = {}
        self._gates: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._store: Any = None
        self._locks: Any = None

    # -- life

    async def _open(self) -> None:
        store, locks = await open_cache_stores(self.settings, poll_interval=self.poll_interval)
        self._store, self._locks = store, locks

    async def _close(self) -> None:
        for claim in list(self._claims.values()):
            await self._drop(claim)
        self._claims.clear()
        await self._locks.close()
        await self._store.close()

    # -- LangChain's interface

    def lookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        return self._call(self._lookup(prompt, llm_string, *_this_caller()))

    async def alookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        return await self._acall(self._lookup(prompt, llm_string, *_this_caller()))

    def update(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        self._call(self._update(prompt, llm_string, return_val))

    async def aupdate(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        await self._acall(self._update(prompt, llm_string, return_val))

    def clear(self, **kwargs: Any) -> None:
        self._call(self._clear())

    async def aclear(self, **kwargs: Any) -> None:
        await self._acall(self._clear())

    def stats(self) -> dict[str, int]:
        """This namespace's counters: hits, misses, waited, computed, entries."""
        result: dict[str, int] = self._call(self._stats())
        return result

    # -- the policy

    def _lock_name(self, key: str) -> str:
        return f"cache/{self.namespace}/{key}"  # ExactCache's: the two interoperate

    async def _fresh(self, key: str) -> JSON | None:
        entry = await self._store.get(self.namespace, key)
        return entry.value if entry is not None and entry.fresh else None

    async def _lookup(
        self, prompt: str, llm_string: str, owner: object, alive: Callable[[], bool]
    ) -> RETURN_VAL_TYPE | None:
        key = cache_key(prompt, llm_string)
        deadline = time.monotonic() + self.wait
        value = await self._fresh(key)
        if value is not None:
            await self._store.count({"hits": 1}, self.namespace)
            return from_json(value)
        await self._store.count({"misses": 1}, self.namespace)
        while True:
            held = self._claims.get(key)
            if held is not None and held.owner is owner:
                return None  # its retry: call the model again rather than wait for itself
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning(
                    "LangChain cache key %s… is being computed elsewhere; calling the model"
                    " after waiting %g s",
                    key[:16],
                    self.wait,
                )
                return None
            if held is not None:  # a caller of this process is calling the model
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await held.done.wait()
            elif await self._claim_or_wait(key, owner, alive, left):
                return None  # claimed: this caller calls the model
            value = await self._fresh(key)
            if value is not None:
                await self._store.count({"waited": 1}, self.namespace)
                return from_json(value)

    async def _claim_or_wait(
        self, key: str, owner: object, alive: Callable[[], bool], left: float
    ) -> bool:
        """Take the key's lock (True), or wait for its release once, at most ``left`` s.

        One caller per key and process at a time asks the servers: a hundred threads
        of one process waiting for a key cost one poller, not a hundred."""
        gate = self._gates.get(key)
        if gate is None:
            gate = self._gates[key] = asyncio.Lock()
        async with gate:
            if key in self._claims or await self._fresh(key) is not None:
                return False  # claimed here, or stored, while this caller queued
            lease = await self._locks.acquire(self._lock_name(key), ttl=self.lock_ttl)
            if lease is None:
                await self._locks.wait_released(self._lock_name(key), left)
                return False
            if await self._fresh(key) is not None:  # stored while we were acquiring
                await self._release(lease)
                return False
            claim = _Claim(lease, owner, alive)
            claim.keeper = asyncio.create_task(self._keep(key, claim), name="herd-lc-claim")
            self._claims[key] = claim
            return True

    async def _update(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        key = cache_key(prompt, llm_string)
        value = to_json(return_val)
        claim = self._claims.pop(key, None)
        delta = time.monotonic() - claim.started if claim is not None else 0.0
        try:
            await self._store.put(self.namespace, key, value, delta=delta, ttl=self.ttl)
            await self._store.count({"computed": 1}, self.namespace)
        finally:
            if claim is not None:  # released after the put: a woken waiter reads the value
                await self._drop(claim)

    async def _keep(self, key: str, claim: _Claim) -> None:
        """Renew the claim every lock_ttl/3 while its caller runs, up to max_hold."""
        period = self.lock_ttl / 3
        renewed = time.monotonic()
        why = ""
        while not why:
            await asyncio.sleep(min(ALIVE_EVERY, period))
            now = time.monotonic()
            if not claim.alive():
                why = "its caller ended without an update (the model call failed?)"
            elif now - claim.started >= self.max_hold:
                why = f"its model call took more than max_hold ({self.max_hold:g} s)"
            elif now - renewed >= period:
                try:
                    if not await self._locks.renew(claim.lease):
                        why = "its lock expired"
                    renewed = now
                except HerdError as exc:  # transient: the lock expires by itself if it lasts
                    log.debug("renewing the claim of %s… failed: %s", key[:16], exc)
        log.info("LangChain cache key %s… released: %s", key[:16], why)
        if self._claims.get(key) is claim:
            del self._claims[key]
        await self._release(claim.lease)
        claim.done.set()

    async def _drop(self, claim: _Claim) -> None:
        await aio.stop(claim.keeper)
        await self._release(claim.lease)
        claim.done.set()

    async def _release(self, lease: LockLease) -> None:
        try:
            await self._locks.release(lease)
        except HerdError as exc:
            log.warning("could not release %r (%s); it expires by itself", lease.name, exc)

    async def _clear(self) -> None:
        await self._store.clear(self.namespace)

    async def _stats(self) -> dict[str, int]:
        found: dict[str, int] = (await self._store.stats()).get(self.namespace, {})
        return found


def split_prompt(prompt: str) -> tuple[str, str]:
    """A prompt's last message's text and the exact form of what came before it.

    LangChain passes a chat model's messages as their JSON serialization, whose
    keys and class paths would swamp an embedding: only the last message is
    matched by meaning; the earlier ones (a system prompt, the conversation) must
    be equal. Anything else (an LLM's plain prompt) is matched whole."""
    with contextlib.suppress(ValueError):
        doc = json.loads(prompt)
        if isinstance(doc, list) and doc and all(_is_message(m) for m in doc):
            content = doc[-1]["kwargs"].get("content")
            if isinstance(content, str):
                return content, canonical(doc[:-1])
            if isinstance(content, list):
                parts = [p if isinstance(p, str) else p.get("text") for p in content]
                if all(isinstance(p, str) for p in parts):
                    return "\n".join(str(p) for p in parts), canonical(doc[:-1])
    return prompt, ""


def _is_message(item: Any) -> bool:
    return isinstance(item, dict) and item.get("lc") == 1 and isinstance(item.get("kwargs"), dict)


class HerdSemanticCache(PortalBacked, BaseCache):
    """LangChain's ``BaseCache`` over ``herd.SemanticCache``: a close enough prompt hits."""

    def __init__(
        self,
        *,
        settings: Settings | None = None,
        embedder: Any = None,
        name: str = NAMESPACE,
        threshold: float = DEFAULT_THRESHOLD,
        guards: bool = True,
        ttl: float | None = 3600.0,
    ) -> None:
        """
        settings: where the cache lives (default: the environment, as ``App()``).
        embedder: turns prompts into vectors (default: all-MiniLM-L6-v2, English).
        name, threshold, guards, ttl: as herd.SemanticCache.
        """
        super().__init__(f"herd-langchain-semantic-{name}")
        from herd.semantic import SemanticCache
        from herd.semantic.runtime import store_for

        self.settings = settings or Settings.from_env()
        if embedder is None:
            from herd.rag.embedders import minilm_embedder

            embedder = minilm_embedder(self.settings.home)
        self.cache = SemanticCache(
            store_for(App(settings=self.settings)),
            embedder=embedder,
            name=name,
            threshold=threshold,
            guards=guards,
            ttl=ttl,
        )

    async def _open(self) -> None:
        await self.cache.open()

    async def _close(self) -> None:
        await self.cache.close()

    @staticmethod
    def _scope(prompt: str, llm_string: str) -> tuple[str, str]:
        text, before = split_prompt(prompt)
        scope = hashlib.sha256(canonical({"llm": llm_string, "before": before}).encode())
        return text, scope.hexdigest()

    async def _lookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        text, scope = self._scope(prompt, llm_string)
        hit = await self.cache.alookup(text, collection=scope)
        return from_json(hit.value) if hit is not None else None

    async def _update(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        text, scope = self._scope(prompt, llm_string)
        await self.cache.astore(text, to_json(return_val), collection=scope)

    def lookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        return self._call(self._lookup(prompt, llm_string))

    async def alookup(self, prompt: str, llm_string: str) -> RETURN_VAL_TYPE | None:
        return await self._acall(self._lookup(prompt, llm_string))

    def update(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        self._call(self._update(prompt, llm_string, return_val))

    async def aupdate(self, prompt: str, llm_string: str, return_val: RETURN_VAL_TYPE) -> None:
        await self._acall(self._update(prompt, llm_string, return_val))

    def clear(self, **kwargs: Any) -> None:
        self._call(self.cache.aclear())

    async def aclear(self, **kwargs: Any) -> None:
        await self._acall(self.cache.aclear())
