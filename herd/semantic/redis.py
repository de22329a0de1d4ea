"""The semantic cache on Redis Stack: one hash per entry, an HNSW index over them.

The index (``FT.CREATE … VECTOR HNSW … DISTANCE_METRIC COSINE``) has the scope
as tags and the expiry as a number, so the KNN query filters inside the index:
``(@tenant:{…} @embedder:{…} … @expires_at:[now +inf])=>[KNN k @vec $v AS dist]``.
A sorted set of last use per cache name bounds the entries: an upsert past the
bound deletes the least recently used, in the same script. Entries also expire
by themselves (PEXPIRE), so an abandoned cache does not keep its memory.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.commands.search.field import NumericField, TagField, VectorField

try:
    from redis.commands.search.index_definition import IndexDefinition, IndexType
except ImportError:  # redis-py 5 (arq still pins it) names the module in camel case
    from redis.commands.search.indexDefinition import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        IndexDefinition,
        IndexType,
    )
from redis.exceptions import ResponseError

from herd.cache.redis import glob_literal
from herd.config import mask_url
from herd.db import redis as rdb
from herd.errors import BrokerError, ConfigError
from herd.jsonvalue import dumps, loads
from herd.locks.base import BaseLocks
from herd.locks.redis import RedisLocks
from herd.names import hash_tag, tagged
from herd.semantic.base import NEVER, Candidate, NewEntry, Scope, Vector

NAMES = "herd:semantic:names"
PLAN_TTL = 5.0  # seconds a scope's search plan is trusted (see _plan)
MIN_EF, MAX_EF = 40, 256
# Half the memory of float32 in the hash and again in the index, and a cosine that
# moves by about 1e-4 at most on unit vectors: the cache scores what is kept (quantize).
VECTOR_TYPE, STORED = "FLOAT16", np.float16
# The index normalises and scores float16 vectors: its similarity can sit up to about
# 1e-3 under the float64 score of the same pair, so the floor is widened by this much.
INDEX_SLACK = 5e-3
_RETURN = (
    "dist", "query", "guard", "value", "vec", "delta", "created_at", "expires_at", "verdicts"
)  # fmt: skip

# Upsert, then evict the least recently used past the bound. Popped members whose
# hash already expired by itself delete nothing and are not counted.
_PUT = """
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('PERSIST', KEYS[1])
end
redis.call('ZADD', KEYS[2], ARGV[1], KEYS[1])
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
local evicted = 0
if over > 0 then
  local old = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #old, 2 do evicted = evicted + redis.call('DEL', old[i]) end
end
return evicted
"""

# Append a verdict, keep the newest ARGV[2]; an entry gone (evicted, expired) stays gone.
_JUDGE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local kept = cjson.decode(redis.call('HGET', KEYS[1], 'verdicts') or '[]')
table.insert(kept, cjson.decode(ARGV[1]))
local keep = tonumber(ARGV[2])
local out = {}
for i = math.max(1, #kept - keep + 1), #kept do table.insert(out, kept[i]) end
redis.call('HSET', KEYS[1], 'verdicts', cjson.encode(out))
return 1
"""

# ARGV: now, then per key: last use, new expiry (or ''), pexpire ms (or ''). Only
# entries that still exist are touched: an evicted one must not come back half-made.
_TOUCH = """
for i = 1, #KEYS - 1 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local at = 2 + (i - 1) * 3
    redis.call('ZADD', KEYS[#KEYS], 'XX', ARGV[at], KEYS[i])
    if ARGV[at + 1] ~= '' then
      redis.call('HSET', KEYS[i], 'expires_at', ARGV[at + 1])
      redis.call('PEXPIRE', KEYS[i], ARGV[at + 2])
    end
  end
end
return 0
"""


def _tag(cache: str) -> str:
    return hash_tag(cache, "semantic cache name", "name")


# The vector type is part of the key: an index made for float32 vectors by an older
# herd keeps its own keys and is left to expire, never fed float16 bytes.
def _prefix(cache: str, dim: int) -> str:
    return f"herd:semantic:{_tag(cache)}:{dim}:{VECTOR_TYPE.lower()}:e:"


def _index(cache: str, dim: int) -> str:
    return f"herd:semantic:{_tag(cache)}:{dim}:{VECTOR_TYPE.lower()}:idx"


def _lru(cache: str) -> str:
    return f"herd:semantic:{_tag(cache)}:lru"


def _stats(cache: str) -> str:
    return f"herd:semantic:{_tag(cache)}:stats"


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisSemanticStore:
    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        m: int = 16,
        ef_construction: int = 64,
        ef_runtime: int | None = None,
        max_connections: int = 32,
    ) -> None:
        """``ef_runtime``: the HNSW search breadth; None: grows with the index (``_plan``).

        ``ef_construction`` 64, not 200: building the graph is most of an insert, and
        at 10,000 random 384-dimensional float16 vectors (the bench's worst case) a near
        repeat (cosine 0.995) is found first 97.8% of the time at EF_RUNTIME 20 and
        100% at 40 with 64, against 99.4% and 100% with 200; 40 gave 96.4% and 99.4%.
        """
        self.url = url
        self.m, self.ef_construction, self.ef_runtime = m, ef_construction, ef_runtime
        self.dim = 0
        # Blocking: a burst of lookups waits for a connection instead of failing.
        # Bytes, not text: vectors travel raw (the process's other Redis pool decodes).
        self._client = rdb.SharedClient(
            url, store="the semantic cache", decode=False, max_size=max_connections
        )
        self._redis: aioredis.Redis = self._client.client
        self._creating = asyncio.Lock()
        self._put = self._redis.register_script(_PUT)
        self._touch = self._redis.register_script(_TOUCH)
        self._judge = self._redis.register_script(_JUDGE)
        self._indexes: set[tuple[str, int]] = set()
        self._plans: dict[tuple[str, str], tuple[float, str]] = {}

    async def _do(self, coro: Any) -> Any:
        with rdb.translate_errors(self.url, store="the semantic cache"):
            return await coro

    def locks(self) -> BaseLocks:
        return RedisLocks(self.url)

    async def open(self, dim: int | None) -> None:
        self.dim = dim or 0
        await self._client.open()

    async def close(self) -> None:
        await self._client.close()

    def quantize(self, vector: Vector) -> Vector:
        return vector.astype(STORED).astype(np.float32)

    async def server_time(self) -> float:
        sec, usec = await self._do(self._redis.time())
        return int(sec) + int(usec) / 1e6

    async def _ensure_index(self, cache: str) -> str:
        name = _index(cache, self.dim)
        if (cache, self.dim) in self._indexes:
            return name
        async with self._creating:
            if (cache, self.dim) not in self._indexes:
                await self._create_index(cache, name)
        return name

    async def _create_index(self, cache: str, name: str) -> None:
        schema: list[Any] = [
            TagField("tenant"),
            TagField("embedder"),
            TagField("collection"),
            TagField("generation"),
            NumericField("expires_at"),
            VectorField(
                "vec",
                "HNSW",
                {
                    "TYPE": VECTOR_TYPE,
                    "DIM": self.dim,
                    "DISTANCE_METRIC": "COSINE",
                    "M": self.m,
                    "EF_CONSTRUCTION": self.ef_construction,
                    "EF_RUNTIME": self.ef_runtime or MIN_EF,
                },
            ),
        ]
        definition = IndexDefinition(  # type: ignore[no-untyped-call]
            prefix=[_prefix(cache, self.dim)], index_type=IndexType.HASH
        )
        try:
            await self._do(self._redis.ft(name).create_index(schema, definition=definition))
        except BrokerError as exc:
            why = str(exc.__cause__ or exc)
            if "unknown command" in why.lower():
                raise ConfigError(
                    f"the semantic cache needs Redis Stack (the search module) at"
                    f" {mask_url(self.url)}; or use HERD_CACHE=postgres"
                ) from exc
            # Another process created it first: the same schema, so that is fine.
            if "already exists" not in why:
                raise
        await self._do(self._redis.sadd(NAMES, cache))
        self._indexes.add((cache, self.dim))

    async def search(
        self, cache: str, scope: Scope, vector: Vector, *, k: int, alive_at: float, floor: float
    ) -> tuple[float | None, list[Candidate]]:
        name = await self._ensure_index(cache)
        where = " ".join(f"@{field}:{{{value}}}" for field, value in scope.tags().items())
        plan = await self._plan(name, where)
        query = f"({where} @expires_at:[({alive_at!r} +inf])=>[KNN {k} @vec $v{plan} AS dist]"
        # The plain command, not ft().search(): building a Query and its Result costs
        # more than a quarter of a lookup at 10,000 entries (measured), and the reply
        # is a flat list that is simple to read.
        reply = await self._do(
            self._redis.execute_command(  # type: ignore[no-untyped-call]
                "FT.SEARCH",
                name,
                query,
                "PARAMS",
                2,
                "v",
                vector.astype(STORED).tobytes(),
                "RETURN",
                len(_RETURN),
                *_RETURN,
                "SORTBY",
                "dist",
                "LIMIT",
                0,
                k,
                "DIALECT",
                2,
            )  # fmt: skip
        )
        near: list[tuple[float, str, dict[bytes, bytes]]] = []
        for i in range(1, len(reply) - 1, 2):
            # A hash deleted (evicted, expired) after the KNN step comes back without
            # fields: as an empty list, or as nil (seen when the TTL ran out mid-query).
            raw = reply[i + 1] or []
            fields = dict(zip(raw[::2], raw[1::2], strict=True))
            if b"vec" in fields:
                near.append((1.0 - float(fields[b"dist"]), _s(reply[i]), fields))  # 1 - cosine
        skip = len(_prefix(cache, self.dim))
        return max((s for s, _, _ in near), default=None), [
            Candidate(
                id=key[skip:],
                query=f[b"query"].decode(),
                guard=loads(f[b"guard"].decode()),
                value=loads(f[b"value"].decode()),
                vector=np.frombuffer(f[b"vec"], dtype=STORED).astype(np.float32),
                delta=float(f[b"delta"]),
                created_at=float(f[b"created_at"]),
                expires_at=float(f[b"expires_at"]),
                verdicts=[
                    (float(at), bool(ok)) for at, ok in loads(f.get(b"verdicts", b"[]").decode())
                ],
            )
            for sim, key, f in near
            if sim >= floor - INDEX_SLACK
        ]

    async def _plan(self, index: str, where: str) -> str:
        """The KNN clause's search options for this scope, refreshed every few seconds.

        The hybrid policy: RediSearch picks it from the filter's estimated size, and
        for a scope that covers nearly everything it often brute-forces the filtered
        set (measured: 1.4 ms against 0.5 ms at 10,000 entries) where batches of HNSW
        results are right there; for a small scope batches are far worse (5.8 ms
        against 0.2 ms). So the choice follows the scope's share of the index.

        The search breadth: with random 384-dimensional vectors, EF_RUNTIME 20 finds a
        near repeat (cosine 0.995) 99.4% of the time at 10,000 entries but 57% at
        100,000, where 128 finds 98.5% and 256 all (measured). Unless it is fixed, it
        grows with the index: one per 800 entries, from 40 (see ``__init__``) to 256.
        """
        now = time.monotonic()
        known = self._plans.get((index, where))
        if known is not None and known[0] > now:
            return known[1]
        pipe = self._redis.pipeline(transaction=False)
        for query in (where, "*"):
            pipe.execute_command("FT.SEARCH", index, query, "LIMIT", 0, 0, "DIALECT", 2)
        mine, total = (int(reply[0]) for reply in await self._do(pipe.execute()))
        ef = self.ef_runtime or min(MAX_EF, max(MIN_EF, total // 800))
        plan = f" EF_RUNTIME {ef}"
        if total > 0 and mine * 2 >= total:
            plan = " HYBRID_POLICY BATCHES" + plan
        if len(self._plans) > 10_000:
            self._plans.clear()
        self._plans[(index, where)] = (now + PLAN_TTL, plan)
        return plan

    async def put(self, cache: str, entry: NewEntry, *, max_entries: int, now: float) -> int:
        await self._ensure_index(cache)
        tags = entry.scope.tags()
        fields: dict[str, Any] = {
            **tags,
            "query": entry.query,
            "guard": dumps(entry.guard, what="guard signature"),
            "value": dumps(entry.value, what="semantic cache value"),
            "vec": entry.vector.astype(STORED).tobytes(),
            "delta": repr(entry.delta),
            "created_at": repr(entry.created_at),
            "expires_at": repr(entry.expires_at),
            "verdicts": "[]",  # a new value: the verdicts on the old one do not hold for it
        }
        pexpire = (
            0
            if entry.expires_at >= NEVER
            else max(1, int((entry.expires_at + entry.keep_stale - now) * 1000))
        )
        args: list[Any] = [repr(now), pexpire, max_entries]
        for key, value in fields.items():
            args += [key, value]
        keys = [_prefix(cache, self.dim) + entry.id, _lru(cache)]
        return int(await self._do(self._put(keys=keys, args=args)))

    async def touch(
        self,
        cache: str,
        used: dict[str, float],
        expires: dict[str, tuple[float, float]] | None = None,
        *,
        now: float = 0.0,
    ) -> None:
        if not used:
            return
        keys, args = [], ["0"]
        for entry_id, at in used.items():
            keys.append(_prefix(cache, self.dim) + entry_id)
            new = (expires or {}).get(entry_id)
            ms = str(max(1, int((new[0] + new[1] - now) * 1000))) if new else ""
            args += [repr(at), repr(new[0]) if new else "", ms]
        await self._do(self._touch(keys=[*keys, _lru(cache)], args=args))

    async def judge(
        self, cache: str, entry_id: str, similarity: float, correct: bool, *, keep: int
    ) -> None:
        await self._ensure_index(cache)
        verdict = dumps([similarity, 1 if correct else 0])
        key = _prefix(cache, self.dim) + entry_id
        await self._do(self._judge(keys=[key], args=[verdict, keep]))

    async def clear(self, cache: str | None = None, collection: str | None = None) -> int:
        caches = (
            [cache] if cache else tagged(_s(c) for c in await self._do(self._redis.smembers(NAMES)))
        )
        removed = 0
        for name in caches:
            pattern = f"herd:semantic:{_tag(glob_literal(name))}:*:e:*"
            keys = [k async for k in self._redis.scan_iter(match=pattern, count=1000)]
            if collection is not None:
                tag = Scope(collection=collection).tags()["collection"]
                tags = await self._do(self._hget_many(keys, "collection"))
                keys = [k for k, t in zip(keys, tags, strict=True) if t and _s(t) == tag]
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                pipe = self._redis.pipeline(transaction=False)
                pipe.unlink(*chunk)
                pipe.zrem(_lru(name), *chunk)
                removed += (await self._do(pipe.execute()))[0]
        return removed

    async def _hget_many(self, keys: list[Any], field: str) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, field)
        return list(await pipe.execute()) if keys else []

    async def add_stats(self, cache: str, amounts: dict[str, int]) -> None:
        pipe = self._redis.pipeline(transaction=False)
        for name, n in amounts.items():
            if n:
                pipe.hincrby(_stats(cache), name, n)
        pipe.sadd(NAMES, cache)
        await self._do(pipe.execute())

    async def read_stats(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for cache in tagged(_s(raw) for raw in await self._do(self._redis.smembers(NAMES))):
            counters = await self._do(self._redis.hgetall(_stats(cache)))
            out[cache] = {_s(k): int(v) for k, v in counters.items()}
            entries = 0
            for info_index in await self._indexes_of(cache):
                try:
                    info = await self._redis.ft(info_index).info()  # type: ignore[no-untyped-call]
                    entries += int(info["num_docs"])
                except ResponseError:
                    continue
            out[cache]["entries"] = entries
        return out

    async def _indexes_of(self, cache: str) -> list[str]:
        names = await self._do(self._redis.execute_command("FT._LIST"))  # type: ignore[no-untyped-call]
        mine = f"herd:semantic:{_tag(cache)}:"
        return [_s(n) for n in names if _s(n).startswith(mine) and _s(n).endswith(":idx")]
