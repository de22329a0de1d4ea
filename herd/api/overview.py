"""What an operator sees, read from the app: queues, running jobs, throughput, the
dead-letter queue, caches and the cost ledger. The dashboard, `herd status` and
/metrics read it through these functions, so the three never disagree.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from herd.api.models import (
    BatchCardOut,
    CacheOut,
    CostOut,
    FailureOut,
    JobSummaryOut,
    LedgerRow,
    LimitOut,
    OverviewOut,
    StageOut,
    ThroughputOut,
)
from herd.app import App
from herd.errors import HerdError
from herd.llm.eval import EvalRuntime, batch_status
from herd.llm.eval.ledger import ESTIMATED, PAID
from herd.queue.base import JobStatus, QueueStats
from herd.schedule import ops as schedule_ops
from herd.semantic.runtime import backend_stats

T = TypeVar("T")
# name or namespace -> figures: counters (hits, misses, entries …) and maybe more (rates,
# histograms), of which the API keeps the counters.
CacheStats = dict[str, dict[str, Any]]


async def _exact_cache(app: App) -> CacheStats:
    return await (await EvalRuntime.of(app)).cache.store.stats()


async def _semantic_cache(app: App) -> CacheStats:
    return await backend_stats(app)


# Every cache the dashboard shows: (name, reader). A new cache adds one line here.
CACHES: list[tuple[str, Callable[[App], Awaitable[CacheStats]]]] = [
    ("exact", _exact_cache),
    ("semantic", _semantic_cache),
]


async def caches(app: App, problems: list[str] | None = None) -> list[CacheOut]:
    """Every cache's namespaces. With ``problems``, a cache that cannot be read is
    noted there and the others are still shown; without, its error is raised."""
    out: list[CacheOut] = []
    for name, read in CACHES:
        try:
            stats = await read(app)
        except HerdError as exc:
            if problems is None:
                raise
            problems.append(f"{name} cache: {exc}")
            continue
        for ns, figures in sorted(stats.items()):
            counters = {
                k: v for k, v in figures.items() if isinstance(v, int) and not isinstance(v, bool)
            }
            hits, misses = counters.get("hits", 0), counters.get("misses", 0)
            out.append(
                CacheOut(
                    cache=name,
                    namespace=ns,
                    entries=counters.get("entries", 0),
                    hits=hits,
                    misses=misses,
                    hit_rate=hits / (hits + misses) if hits + misses else None,
                    counters=counters,
                )
            )
    return out


LEDGER_KINDS = ("call", "lost", "failed", "cut_short", "cache", "singleflight", "dedup")


async def ledger(app: App) -> list[LedgerRow]:
    """The cost ledger per kind, from its summary (herd.llm.eval.ledger): O(kinds) on every
    poll, and the totals outlive the rows purged after HERD_LEDGER_TTL. Money saved is
    estimated per key: a call avoided would have cost what one computation of its key
    cost."""
    found = await (await EvalRuntime.of(app)).store.totals()
    return [
        LedgerRow(
            kind=k,
            calls=found[k]["n"],
            input_tokens=found[k]["input_tokens"],
            output_tokens=found[k]["output_tokens"],
            cost=found[k]["cost"],
            saved=found[k]["saved"],
            cached_input_tokens=found[k]["cached_input_tokens"],
            cache_write_tokens=found[k]["cache_write_tokens"],
            provider_cache_saved=found[k]["provider_cache_saved"],
            unpriced=found[k]["unpriced"],
        )
        if k in found
        else LedgerRow(kind=k, calls=0, input_tokens=0, output_tokens=0, cost=None, saved=None)
        for k in LEDGER_KINDS
    ]


async def limits(app: App) -> list[LimitOut]:
    """Each fleet-wide provider limit with its use, waits and 429s: one read of the
    limits' own rows or keys, O(limits) on every poll."""
    limiter = (await EvalRuntime.of(app)).limiter
    if limiter is None:
        return []
    now = time.time()
    return [LimitOut.of(s, now) for s in await limiter.stats()]


SCHEDULES_SHOWN = 50  # periodic jobs are defined in code: a few, two reads per poll
# The busiest concurrency keys (running plus waiting), from the keys' counters: a row
# per key with work, never the jobs (herd_key_counts; Redis: three hashes a queue).
KEYS_SHOWN = 10
BATCHES_SHOWN = 10  # the newest batches on the dashboard (and older ones still parked)
FAILURES_ON_CARD = 10
# An idle batch's card (nothing queued or running: finished, or parked with no call in
# flight) is kept this long, or until its row changes (a submission, a park, a resume, a
# spend), so a poll reads no items of batches where nothing moves.
IDLE_KEPT = 60.0
_idle: weakref.WeakKeyDictionary[App, dict[str, tuple[datetime, float, BatchCardOut]]] = (
    weakref.WeakKeyDictionary()
)


async def batches(app: App, limit: int = BATCHES_SHOWN) -> list[BatchCardOut]:
    """A card per batch: the ``limit`` newest and older ones still parked. The batch
    rows are read through their index; the items only of batches with work queued or
    running (an idle batch's card is kept until its row changes), so a poll costs
    O(active work), not O(documents ever evaluated)."""
    rt = await EvalRuntime.of(app)
    kept = _idle.setdefault(app, {})
    now = time.monotonic()
    out = []
    for name, updated in await rt.store.dashboard_batches(limit):
        found = kept.get(name)
        if found is not None and found[0] == updated and found[1] > now:
            out.append(found[2])
            continue
        card = await batch_card(app, name)
        if card.queued == 0 and card.running == 0:
            kept[name] = (updated, now + IDLE_KEPT, card)
        else:
            kept.pop(name, None)
        out.append(card)
    for name in set(kept) - {c.batch for c in out}:
        del kept[name]
    return out


async def batch_card(app: App, batch: str) -> BatchCardOut:
    """One batch's card: its status, with its cost by model where the ledger's rows
    are all there (by ledger kind otherwise)."""
    st = await batch_status(app, batch)
    rt = await EvalRuntime.of(app)
    models = await rt.store.model_costs(batch)
    paid = sum(t["n"] for k, t in st.ledger.items() if k in PAID)
    costs: list[CostOut]
    costs_by: Literal["model", "kind"]
    if models and sum(m[1] for m in models) == paid:
        costs_by = "model"
        costs = [
            CostOut(label=model or "?", calls=n, input_tokens=i, output_tokens=o, cost=cost,
                    unpriced=bool(unpriced) or model in st.unpriced, estimated_cost=est)
            for model, n, i, o, cost, unpriced, est in models
        ]  # fmt: skip
    else:
        costs_by = "kind"
        costs = [
            CostOut(label=kind, calls=t["n"], input_tokens=t["input_tokens"],
                    output_tokens=t["output_tokens"], cost=t["cost"],
                    unpriced=t["cost"] is None and bool(st.unpriced),
                    estimated=kind in ESTIMATED,
                    estimated_cost=t["cost"] if kind in ESTIMATED else None)
            for kind, t in st.ledger.items() if kind in PAID and t["n"]
        ]  # fmt: skip
    failures = [FailureOut.model_validate(f) for f in st.failures[:FAILURES_ON_CARD]]
    return BatchCardOut(
        batch=batch,
        created_at=st.created_at.isoformat() if st.created_at else None,
        documents=st.documents, done=st.done, dead=st.dead, lost=st.lost,
        running=st.running, queued=st.queued, parked_items=st.parked_items,
        cancelled_items=st.cancelled_items, budget=st.budget, spent=st.spent,
        reserved=st.reserved, estimated=st.estimated, unpriced=st.unpriced,
        parked=st.parked, parked_reason=st.parked_reason, next=st.next, rate=st.rate,
        eta=st.eta, waited_for_limits=st.waited_for_limits, costs_by=costs_by, costs=costs,
        failures=failures, more_failures=max(0, st.dead + st.lost - len(failures)),
        stages=[StageOut.model_validate(s) for s in st.stages],
    )  # fmt: skip


async def optional(what: str, read: Awaitable[list[T]], problems: list[str]) -> list[T]:
    """Caches and the ledger live beside the queue (and may be down while it is up)."""
    try:
        return await read
    except HerdError as exc:
        problems.append(f"{what}: {exc}")
        return []


# The row that sums the queues not shown one by one: no queue can bear this name
# (braces are refused in queue names: herd.queue.redis.prefix, the API's QueueName).
OTHERS = "{others}"


def busiest(stats: list[QueueStats], shown: int) -> tuple[list[QueueStats], int]:
    """The ``shown`` busiest queues (jobs to run, then dead, then succeeded), in name
    order, and one OTHERS row summing the rest; also how many the OTHERS row sums.
    Whoever may enqueue may name queues: every poll stays bounded in their number."""
    if len(stats) <= shown:
        return stats, 0

    def activity(q: QueueStats) -> tuple[int, int, int]:
        c = q.counts
        return depth(q), c.get(JobStatus.DEAD, 0), c.get(JobStatus.SUCCEEDED, 0)

    ranked = sorted(stats, key=lambda q: (tuple(-n for n in activity(q)), q.queue))
    top, rest = ranked[:shown], ranked[shown:]
    counts: dict[JobStatus, int] = {}
    for q in rest:
        for status, n in q.counts.items():
            counts[status] = counts.get(status, 0) + n
    ages = [q.oldest_ready_age for q in rest if q.oldest_ready_age is not None]
    others = QueueStats(
        OTHERS,
        counts,
        ready=sum(q.ready for q in rest),
        oldest_ready_age=max(ages) if ages else None,
    )
    return [*sorted(top, key=lambda q: q.queue), others], len(rest)


async def overview(app: App, *, minutes: int = 30, limit: int = 50) -> OverviewOut:
    problems: list[str] = []
    stats = await app.stats()
    # The running list walks the index of leased jobs, which holds an entry for every
    # job claimed since the last vacuum (300,000 after a drain: hundreds of ms); the
    # counters say exactly when nothing is running, and then it is not read.
    busy = any(s.counts.get(JobStatus.PROCESSING, 0) for s in stats)
    # One read after another: side by side, each would take a connection of its own
    # from the pool, and one idle since the last poll is checked first (a round trip);
    # in turn they share the connection the first read took.
    running = await app.broker.running(limit) if busy else []
    tp = await app.broker.throughput(minutes)
    dead = await app.dead_letters(limit=limit)
    recent = await app.list_jobs(limit=10)
    cache_rows = await caches(app, problems)
    ledger_rows = await optional("cost ledger", ledger(app), problems)
    limit_rows = await optional("provider limits", limits(app), problems)
    batch_cards = await optional("evaluation batches", batches(app), problems)
    schedule_rows = await optional(
        "schedules", schedule_ops.views(app, limit=SCHEDULES_SHOWN), problems
    )
    key_rows = await optional("concurrency keys", app.key_stats(KEYS_SHOWN), problems)
    shown, hidden = busiest(stats, app.settings.shown_queues)
    return OverviewOut(
        now=datetime.now(UTC),
        broker=app.broker.name,
        queues=shown,
        queues_hidden=hidden,
        running=running,
        throughput=ThroughputOut.of(tp),
        dead=[JobSummaryOut.of(j) for j in dead],
        recent=[JobSummaryOut.of(j) for j in recent],
        caches=cache_rows,
        ledger=ledger_rows,
        limits=limit_rows,
        batches=batch_cards,
        schedules=schedule_rows,
        keys=key_rows,
        problems=problems,
    )


def depth(q: QueueStats) -> int:
    """Jobs still to run: pending (due or delayed) and running."""
    return q.counts.get(JobStatus.PENDING, 0) + q.counts.get(JobStatus.PROCESSING, 0)
