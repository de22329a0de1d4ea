"""GET /metrics (Prometheus text format) and GET /healthz.

The collector reads the app at scrape time into a registry of this server's
own: no process-wide default registry, so two apps in one process (tests, an
embedding program) never mix their numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import psycopg
import redis.asyncio as aioredis
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from herd._version import __version__
from herd.api import overview
from herd.api.deps import HerdApp
from herd.api.models import CacheOut, HealthOut, LedgerRow, LimitOut
from herd.app import App
from herd.config import mask_url
from herd.db.postgres import connect_kwargs
from herd.db.redis import client_name
from herd.errors import HerdError
from herd.llm.eval.ledger import PAID
from herd.queue.base import JobStatus, QueueStats

router = APIRouter(tags=["operations"])


@dataclass
class Reading:
    queues: list[QueueStats] = field(default_factory=list)
    caches: list[CacheOut] = field(default_factory=list)
    ledger: list[LedgerRow] = field(default_factory=list)
    limits: list[LimitOut] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


async def read(app: App) -> Reading:
    # The busiest queues one by one, the rest summed under queue="{others}": a label
    # value per queue name would let whoever may enqueue grow every scrape.
    reading = Reading(queues=overview.busiest(await app.stats(), app.settings.shown_queues)[0])
    reading.caches = await overview.caches(app, reading.problems)
    reading.ledger = await overview.optional("ledger", overview.ledger(app), reading.problems)
    reading.limits = await overview.optional("limits", overview.limits(app), reading.problems)
    return reading


class HerdCollector(Collector):
    """Turns the latest reading into metric families; the route reads, then renders,
    with no await in between, so concurrent scrapes cannot see each other's reading."""

    def __init__(self) -> None:
        self.reading = Reading()

    def collect(self) -> Iterator[Metric]:
        r = self.reading
        jobs = GaugeMetricFamily(
            "herd_queue_jobs", "Jobs by queue and status.", labels=["queue", "status"]
        )
        ready = GaugeMetricFamily("herd_queue_ready", "Pending jobs due now.", labels=["queue"])
        age = GaugeMetricFamily(
            "herd_queue_oldest_ready_age_seconds",
            "Wait of the oldest due job (PostgreSQL: the next in line).",
            labels=["queue"],
        )
        running = GaugeMetricFamily(
            "herd_jobs_running", "Jobs leased by a worker.", labels=["queue"]
        )
        dead = GaugeMetricFamily(
            "herd_jobs_dead_lettered", "Jobs in the dead-letter queue.", labels=["queue"]
        )
        # A gauge, not a counter: succeeded rows go after HERD_FINISHED_TTL, and a
        # counter must never fall.
        done = GaugeMetricFamily(
            "herd_jobs_succeeded_retained",
            "Succeeded jobs whose rows are still kept (HERD_FINISHED_TTL).",
            labels=["queue"],
        )
        for q in r.queues:
            for st in JobStatus:
                jobs.add_metric([q.queue, st.value], q.counts.get(st, 0))
            ready.add_metric([q.queue], q.ready)
            if q.oldest_ready_age is not None:
                age.add_metric([q.queue], q.oldest_ready_age)
            running.add_metric([q.queue], q.counts.get(JobStatus.PROCESSING, 0))
            dead.add_metric([q.queue], q.counts.get(JobStatus.DEAD, 0))
            done.add_metric([q.queue], q.counts.get(JobStatus.SUCCEEDED, 0))
        info = GaugeMetricFamily(
            "herd_build_info", "herd's version (always 1).", labels=["version"]
        )
        info.add_metric([__version__], 1)
        yield from (info, jobs, ready, age, running, dead, done)

        labels = ["cache", "namespace"]
        hits = CounterMetricFamily("herd_cache_hits", "Cache lookups answered.", labels=labels)
        misses = CounterMetricFamily(
            "herd_cache_misses", "Cache lookups not answered.", labels=labels
        )
        entries = GaugeMetricFamily("herd_cache_entries", "Entries stored.", labels=labels)
        events = CounterMetricFamily(
            "herd_cache_events", "Other cache counters.", labels=[*labels, "event"]
        )
        for c in r.caches:
            hits.add_metric([c.cache, c.namespace], c.hits)
            misses.add_metric([c.cache, c.namespace], c.misses)
            entries.add_metric([c.cache, c.namespace], c.entries)
            for name, value in sorted(c.counters.items()):
                if name not in ("hits", "misses", "entries"):
                    events.add_metric([c.cache, c.namespace, name], value)
        yield from (hits, misses, entries, events)

        calls = CounterMetricFamily(
            "herd_eval_ledger_calls",
            "Provider calls made (call, lost) and avoided.",
            labels=["kind"],
        )
        tokens = CounterMetricFamily(
            "herd_eval_ledger_tokens", "Tokens of the ledger's rows.", labels=["kind", "direction"]
        )
        cost = CounterMetricFamily("herd_eval_ledger_cost_dollars", "Money paid.", labels=["kind"])
        saved = CounterMetricFamily(
            "herd_eval_ledger_saved_dollars", "Money not paid (estimated).", labels=["kind"]
        )
        provider_tokens = CounterMetricFamily(
            "herd_eval_provider_cache_tokens",
            "Input tokens read from (read) and written to (write) the provider's prompt cache.",
            labels=["kind", "direction"],
        )
        # A gauge: a cache write costs more than plain input (Anthropic 1.25 x), so the
        # sum dips until reads pay it back, and a counter must never go down.
        provider_saved = GaugeMetricFamily(
            "herd_eval_provider_cache_saved_dollars",
            "Money the provider's prompt cache saved (full input price minus the cost),"
            " apart from herd's own cache.",
        )
        provider_total = 0.0
        for row in r.ledger:
            provider_tokens.add_metric([row.kind, "read"], row.cached_input_tokens)
            provider_tokens.add_metric([row.kind, "write"], row.cache_write_tokens)
            provider_total += row.provider_cache_saved or 0.0
            calls.add_metric([row.kind], row.calls)
            tokens.add_metric([row.kind, "input"], row.input_tokens)
            tokens.add_metric([row.kind, "output"], row.output_tokens)
            # Calls to a model without a price cost an unknown sum: no sample, never $0
            # (an avoided call paid nothing: 0).
            if row.cost is not None or row.kind not in PAID or not row.calls:
                cost.add_metric([row.kind], row.cost or 0.0)
            if row.saved is not None:
                saved.add_metric([row.kind], row.saved)
        provider_saved.add_metric([], provider_total)
        yield from (calls, tokens, cost, saved, provider_tokens, provider_saved)
        yield from _limit_metrics(r.limits)

        problems = GaugeMetricFamily(
            "herd_scrape_problems",
            "Sections that could not be read in this scrape.",
            labels=["section"],
        )
        for p in r.problems:
            problems.add_metric([p.split(":", 1)[0]], 1)
        yield problems


def _limit_metrics(rows: list[LimitOut]) -> Iterator[Metric]:
    """Per fleet-wide provider limit: what it allows, what it uses now, what it granted,
    how often callers waited, and the provider's 429s."""
    dims = ["scope", "dimension"]
    allowed = GaugeMetricFamily(
        "herd_limit_allowed", "What the limit allows per period (concurrent: at once).", labels=dims
    )
    used = GaugeMetricFamily(
        "herd_limit_used", "Counted against the limit in the current period (or in flight).",
        labels=dims,
    )  # fmt: skip
    granted = CounterMetricFamily(
        "herd_limit_granted", "Requests and tokens granted under the limit.", labels=dims
    )
    waits = CounterMetricFamily(
        "herd_limit_waits", "Calls that waited for capacity.", labels=["scope"]
    )
    waited = CounterMetricFamily(
        "herd_limit_wait_seconds", "Seconds calls waited for capacity.", labels=["scope"]
    )
    refused = CounterMetricFamily(
        "herd_limit_rate_limited", "The provider's 429s; each paused the limit.", labels=["scope"]
    )
    paused = GaugeMetricFamily(
        "herd_limit_paused_seconds", "Seconds the limit stays paused.", labels=["scope"]
    )
    for row in rows:
        for dim, limit, now, total in (
            ("requests", row.rpm, row.requests_now, row.requests),
            ("tokens", row.tpm, row.tokens_now, row.tokens),
            ("concurrent", row.max_concurrent, row.in_flight, None),
        ):
            if limit is not None:
                allowed.add_metric([row.scope, dim], limit)
            used.add_metric([row.scope, dim], now)
            if total is not None:
                granted.add_metric([row.scope, dim], total)
        waits.add_metric([row.scope], row.waits)
        waited.add_metric([row.scope], row.wait_seconds)
        refused.add_metric([row.scope], row.rate_limited)
        paused.add_metric([row.scope], row.paused_for)
    yield from (allowed, used, granted, waits, waited, refused, paused)


def _registry(request: Request) -> tuple[CollectorRegistry, HerdCollector]:
    state = request.app.state
    if not hasattr(state, "metrics"):
        collector = HerdCollector()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        state.metrics = (registry, collector)
    found: tuple[CollectorRegistry, HerdCollector] = state.metrics
    return found


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics(request: Request, app: HerdApp) -> Response:
    """Queue depth, running, dead-lettered and completed jobs, cache hits and misses,
    the evaluation cost ledger: read now, in Prometheus text format."""
    registry, collector = _registry(request)
    collector.reading = await read(app)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


# The probes connect anew, on purpose: a pool's wait would turn "down" into a slow
# answer. They are named like every herd connection (herd.db), prepare nothing
# (PgBouncer-safe) and close at once.
async def _check_postgres(url: str) -> None:
    try:
        kwargs = connect_kwargs(url, pooler=True)
        conn = await psycopg.AsyncConnection.connect(url, **kwargs, connect_timeout=3)
        async with conn:
            await conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise HerdError(mask_url(f"PostgreSQL at {url}: {_first_line(exc)}")) from exc


async def _check_redis(url: str) -> None:
    try:
        client = aioredis.Redis.from_url(
            url, socket_connect_timeout=3, socket_timeout=3, client_name=client_name()
        )
    except ValueError as exc:  # a URL redis-py cannot parse (an unencoded '/' in a password)
        raise HerdError(mask_url(f"Redis at {url}: {exc}")) from exc
    try:
        await client.ping()
    except (aioredis.RedisError, OSError) as exc:
        raise HerdError(mask_url(f"Redis at {url}: {_first_line(exc)}")) from exc
    finally:
        await client.aclose()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@router.get("/healthz", response_model=HealthOut, responses={503: {"model": HealthOut}})
async def healthz(app: HerdApp) -> Response:
    """ok when the database (and Redis, when configured) answers; 503 with the reason."""
    checks: dict[str, str] = {}
    probes = [("database", _check_postgres, app.settings.database_url or app.database_url())]
    if app.settings.redis_url:
        probes.append(("redis", _check_redis, app.settings.redis_url))
    for name, probe, url in probes:
        try:
            await probe(url)
            checks[name] = "ok"
        except HerdError as exc:
            checks[name] = str(exc)
    health = HealthOut(
        status="ok" if all(v == "ok" for v in checks.values()) else "down",
        version=__version__,
        checks=checks,
    )
    return JSONResponse(health.model_dump(), status_code=200 if health.status == "ok" else 503)
