"""Queue numbers of the Redis broker: the low bits of every job id of a queue, given
in herd:{queues}'s slot (queue_number.lua), bounded (HERD_MAX_QUEUES), given back by
empty queues (queue_free.lua and retire.lua), and cached by each process.
docs/cluster.md tells the protocol and why each step is there."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from herd.db.redis import Script
from herd.errors import InvalidInput
from herd.masking import mask

# A job id is its queue's own counter times 2**QUEUE_BITS plus the queue's number, so
# that enqueueing touches the queue's slot only and an id says where its job is. Ids
# stay below 2**53 (exact in JSON numbers) up to a counter of 2**33, which the clock
# floor of enqueue.lua (4 a second since 2026) reaches in 2094.
QUEUE_BITS = 20
QUEUE_MASK = (1 << QUEUE_BITS) - 1
# The queue numbers, in one slot of their own.
QUEUE_KEYS = [
    "herd:{queues}:num",
    "herd:{queues}:name",
    "herd:{queues}:next",
    "herd:{queues}:free",
]
# A process trusts the queue it read for a number this long; a reclaimed number is
# given again only after FREED_WAIT, so that no process still reads it as the old queue.
NAME_CACHE_S = 60.0
FREED_WAIT_US = 600 * 1_000_000
# An empty queue keeps its number while its throughput may still be shown (the
# dashboard's window is at most 2 hours): its name is how that rollup is found.
RECLAIM_IDLE_MINUTES = 120


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class QueueNumbers:
    """One broker's view of the numbers: ``redis`` gives its client (once open),
    ``errors`` translates Redis errors, ``scripts`` are its registered scripts."""

    def __init__(
        self,
        url: str,
        redis: Callable[[], Any],
        scripts: dict[str, Script],
        errors: Callable[[], AbstractContextManager[None]],
        *,
        max_queues: int,
        reclaim_idle_minutes: int,
    ) -> None:
        self.url = url
        self._redis, self._scripts, self._errors = redis, scripts, errors
        self.max_queues = min(max_queues, QUEUE_MASK)
        self.reclaim_idle_minutes = reclaim_idle_minutes
        self.legacy = False  # an older herd's herd:jobq exists (open() says)
        self._numbers: dict[str, tuple[int, int]] = {}
        # number -> (queue, monotonic time read): trusted NAME_CACHE_S (reclaim)
        self._names: dict[int, tuple[str, float]] = {}

    def forget(self, queue: str) -> None:
        number, _ = self._numbers.pop(queue, (None, 0))
        if number is not None and self._names.get(number, ("",))[0] == queue:
            del self._names[number]

    async def number(self, queue: str) -> tuple[int, int, int]:
        """The queue's number, where its own id counter starts, and the server time (µs)
        the number was read at, 0 when it comes from this process's cache (enqueue.lua
        checks it against the queue's slot)."""
        if queue in self._numbers:
            return (*self._numbers[queue], 0)
        with self._errors():
            number, read = await self._scripts["queue_number"](
                keys=QUEUE_KEYS, args=[queue, self.max_queues, FREED_WAIT_US]
            )
            # Past every id an older herd drew from its global counter.
            legacy = int(await self._redis().get("herd:ids") or 0)
        if not number:
            raise InvalidInput(
                f"queue {queue!r} would be one queue more than HERD_MAX_QUEUES"
                f" ({self.max_queues}) on {mask(self.url)}: enqueue into an existing"
                " queue, or raise HERD_MAX_QUEUES",
                field="queue",
            )
        self._numbers[queue] = (int(number), (legacy >> QUEUE_BITS) + 1 if legacy else 0)
        self._names[int(number)] = (queue, time.monotonic())
        return (*self._numbers[queue], int(read))

    async def names(self, job_ids: Sequence[int]) -> list[str | None]:
        """The queue of each job id: its low bits are the queue's number, or, for an id
        an older herd gave (from herd:ids), the herd:jobq index it wrote."""
        stale = time.monotonic() - NAME_CACHE_S
        known = {n for n, (_, read) in self._names.items() if read > stale}
        unknown = sorted({i & QUEUE_MASK for i in job_ids} - known)
        redis = self._redis()
        with self._errors():
            if unknown:
                names = await redis.hmget(QUEUE_KEYS[1], [str(n) for n in unknown])
                for number, name in zip(unknown, names, strict=True):
                    if name is None:
                        self._names.pop(number, None)
                    else:
                        self._names[number] = (_text(name), time.monotonic())
            legacy: list[Any] = [None] * len(job_ids)
            if self.legacy:
                legacy = await redis.hmget("herd:jobq", [str(i) for i in job_ids])
        return [
            _text(old) if old is not None else self._names.get(i & QUEUE_MASK, (None,))[0]
            for i, old in zip(job_ids, legacy, strict=True)
        ]

    async def queues(self) -> list[str]:
        """The queues with a number, and those an older herd listed in herd:queues."""
        redis = self._redis()
        with self._errors():
            numbered = await redis.hkeys(QUEUE_KEYS[0])
            legacy = await redis.smembers("herd:queues")
        return sorted({_text(q) for q in [*numbered, *legacy]})

    async def reclaim(self, empty: Sequence[str], prefix: Callable[[str], str]) -> list[str]:
        """Give back the numbers of ``empty`` queues still without a job; the queues
        reclaimed. A queue enqueued into again takes a number anew."""
        freed: list[str] = []
        run = self._scripts["queue_free"]
        for queue in empty:
            with self._errors():
                number, begun = await run(keys=QUEUE_KEYS, args=[queue, "begin", 0, 0])
                if not number:
                    continue
                p = prefix(queue)
                emptied = await self._scripts["retire"](
                    keys=[p + "meta"], args=[p, number, begun, self.reclaim_idle_minutes]
                )
                await run(keys=QUEUE_KEYS, args=[queue, "end", number, int(emptied)])
                if emptied:
                    await self._redis().srem("herd:queues", queue)
            if emptied:
                self.forget(queue)
                freed.append(queue)
        return freed
