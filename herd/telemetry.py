"""OpenTelemetry spans for enqueue, claim, run and model calls, when the API is installed.

herd uses the ``opentelemetry-api`` package only: spans are recorded and exported
once the application installs an SDK and sets a tracer provider (docs/telemetry.md).
Without the package every helper here is a no-op and nothing of OpenTelemetry is
imported; with the API and no SDK, the API's own no-op tracer answers and nothing
is recorded. The rest of herd calls these helpers and never OpenTelemetry itself.

Conventions: OpenTelemetry's messaging spans (``send`` PRODUCER, ``receive``
CLIENT, ``process`` CONSUMER, ``messaging.system`` = "herd") and its GenAI client
spans (``chat {model}``), plus ``herd.*`` attributes. The trace context travels in
the job (``NewJob.trace_context``: a W3C ``traceparent``/``tracestate`` carrier), so
a job's run continues the trace of the request that enqueued it, on any broker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from decimal import Decimal
from functools import cache
from typing import TYPE_CHECKING, Any

from herd.queue.base import MAX_TRACE_CONTEXT_BYTES, EnqueueResult, Lease, NewJob

if TYPE_CHECKING:
    from herd.llm.completion import Completion, Usage
    from herd.llm.pricing import Price

try:
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
except ImportError:  # the optional package is absent: every helper is a no-op
    _context = None  # type: ignore[assignment]
    _trace = None  # type: ignore[assignment]

log = logging.getLogger("herd.telemetry")

ENABLED = _trace is not None
SYSTEM = "herd"  # messaging.system
# What herd.cache.source says of an answer served without calling the provider, by
# the exact cache's lookup source (herd.cache.exact.Source).
SERVED_BY = {"hit": "exact_cache", "waited": "singleflight", "stale": "exact_cache_stale"}
_warned_oversized = False


def enabled() -> bool:
    """Whether the OpenTelemetry API is importable (spans go to its tracer provider)."""
    return ENABLED


def _recording() -> bool:
    """Whether a tracer provider (an SDK) is set: with the API alone, no span is made
    and only a context that came with a job is passed on."""
    return not isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider)


@cache
def _tracer() -> Any:
    # Asked once a provider is set (_recording), which the API lets be set only once.
    from herd._version import __version__

    return _trace.get_tracer("herd", __version__)


def _propagate() -> Any:
    # Imported on first use: it loads the configured propagators' entry points.
    from opentelemetry import propagate

    return propagate


def _bounded(carrier: dict[str, str]) -> dict[str, str] | None:
    """The carrier as stored: at most MAX_TRACE_CONTEXT_BYTES. An oversized one (a
    long tracestate, or baggage from another propagator) is cut to its traceparent,
    which is enough for the trace to continue; never an error for the enqueue."""
    global _warned_oversized
    if not carrier:
        return None
    if sum(len(k) + len(v) for k, v in carrier.items()) <= MAX_TRACE_CONTEXT_BYTES:
        return carrier
    if not _warned_oversized:
        _warned_oversized = True
        log.warning(
            "the trace context of a job is over %d bytes (%s): only its traceparent is kept",
            MAX_TRACE_CONTEXT_BYTES,
            ", ".join(sorted(carrier)),
        )
    parent = carrier.get("traceparent")
    return {"traceparent": parent} if parent and len(parent) < MAX_TRACE_CONTEXT_BYTES else None


def _messaging(queue: str) -> dict[str, Any]:
    return {"messaging.system": SYSTEM, "messaging.destination.name": queue}


class Sending:
    """A PRODUCER ``send`` span around one enqueue round trip (a batch of jobs), its
    context injected into every job of ``jobs`` that carries none yet; ``sent``
    names the id given to a single job. A no-op without the package."""

    def __init__(self, jobs: Sequence[NewJob]) -> None:
        self.jobs = jobs
        self._span: Any = None
        self._token: Any = None

    def __enter__(self) -> Sending:
        if not ENABLED or not self.jobs:
            return self
        if _recording():
            self._span = _tracer().start_span(
                f"send {_destination(self.jobs)}",
                kind=_trace.SpanKind.PRODUCER,
                attributes=self._attributes(),
            )
            self._token = _context.attach(_trace.set_span_in_context(self._span))
        elif not _trace.get_current_span().get_span_context().is_valid:
            return self  # no span and none to pass on (the common case without an SDK)
        carrier: dict[str, str] = {}
        _propagate().inject(carrier)
        stored = _bounded(carrier)
        if stored is not None:
            self.jobs = [
                j if j.trace_context is not None else replace(j, trace_context=stored)
                for j in self.jobs
            ]
        return self

    def _attributes(self) -> dict[str, Any]:
        attrs = {
            **_messaging(_destination(self.jobs)),
            "messaging.operation.type": "send",
            "messaging.operation.name": "enqueue",
            "herd.job.task": self.jobs[0].task,
        }
        if len(self.jobs) > 1:
            attrs["messaging.batch.message_count"] = len(self.jobs)
        return attrs

    def sent(self, results: Sequence[EnqueueResult]) -> None:
        if self._span is not None and len(results) == 1:
            self._span.set_attribute("messaging.message.id", str(results[0].job_id))

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if self._span is None:
            return
        _context.detach(self._token)
        if exc is not None:
            self._span.record_exception(exc)
            self._span.set_status(_trace.Status(_trace.StatusCode.ERROR, str(exc)[:1000]))
        self._span.end()


def sending(jobs: Sequence[NewJob]) -> Sending:
    return Sending(jobs)


def _destination(jobs: Sequence[NewJob]) -> str:
    queue = jobs[0].queue
    if all(j.queue == queue for j in jobs):
        return queue
    return ",".join(sorted({j.queue for j in jobs}))


def _extract(carrier: dict[str, str] | None) -> Any:
    return _propagate().extract(carrier) if carrier else None


def claimed(queues: Sequence[str], owner: str, started: int, leases: Sequence[Lease]) -> None:
    """A CLIENT ``receive`` span for one claim round trip that brought jobs (an idle
    worker's empty polls are not recorded), linked to each job's creation context.
    ``started``: time.time_ns() before the claim was sent."""
    if not ENABLED or not leases or not _recording():
        return
    links = []
    for lease in leases:
        ctx = _extract(lease.trace_context)
        span_ctx = _trace.get_current_span(ctx).get_span_context() if ctx else None
        if span_ctx is not None and span_ctx.is_valid:
            links.append(_trace.Link(span_ctx, {"messaging.message.id": str(lease.job_id)}))
    destination = ",".join(queues)
    span = _tracer().start_span(
        f"receive {destination}",
        kind=_trace.SpanKind.CLIENT,
        links=links,
        start_time=started,
        attributes={
            **_messaging(destination),
            "messaging.operation.type": "receive",
            "messaging.operation.name": "claim",
            "messaging.batch.message_count": len(leases),
            "messaging.client.id": owner,
        },
    )
    span.end()


class Run:
    """A job run's CONSUMER ``process`` span: current while the task runs, a child of
    the context the job was enqueued in, ended when the run's outcome is written."""

    def __init__(self, lease: Lease, worker: str) -> None:
        self._span: Any = None
        self._parent: Any = None
        self._token: Any = None
        if not ENABLED:
            return
        self._parent = _extract(lease.trace_context)
        if not _recording():
            return  # the job's context is still passed on to what the task enqueues
        self._span = _tracer().start_span(
            f"process {lease.queue}",
            context=self._parent,
            kind=_trace.SpanKind.CONSUMER,
            attributes={
                **_messaging(lease.queue),
                "messaging.operation.type": "process",
                "messaging.operation.name": "run",
                "messaging.message.id": str(lease.job_id),
                "messaging.client.id": worker,
                "herd.job.task": lease.task,
                # The run this is: errors so far plus one, as max_attempts counts them.
                "herd.job.attempt": lease.attempts + 1,
                "herd.job.stalls": lease.stalls,
                "herd.lease.token": lease.token,
            },
        )

    def __enter__(self) -> Run:
        if self._span is not None:
            self._token = _context.attach(_trace.set_span_in_context(self._span))
        elif self._parent is not None:
            self._token = _context.attach(self._parent)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _context.detach(self._token)
        if self._span is not None:
            self._span.end()

    def failed(self, error: str, exc: BaseException | None = None) -> None:
        """The task raised (or its result could not be stored): status ERROR."""
        if self._span is None:
            return
        if exc is not None:
            self._span.record_exception(exc)
            self._span.set_attribute("error.type", type(exc).__qualname__)
        self._span.set_status(_trace.Status(_trace.StatusCode.ERROR, error[:1000]))

    def outcome(self, outcome: str) -> None:
        """What the store recorded: succeeded, retry, dead, snoozed."""
        if self._span is not None:
            self._span.set_attribute("herd.job.outcome", outcome)

    def lease_lost(self, why: str) -> None:
        """The lease went to another worker: nothing of this run was written."""
        if self._span is None:
            return
        self._span.add_event("herd.lease_lost", {"herd.lease.lost_reason": why})
        self._span.set_attribute("herd.job.outcome", "lease_lost")
        self._span.set_attribute("error.type", "LeaseLost")
        self._span.set_status(_trace.Status(_trace.StatusCode.ERROR, f"lease lost: {why}"))


def _genai(provider: str, model: str) -> dict[str, Any]:
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,  # the name before semantic conventions 1.37
        "gen_ai.request.model": model,
    }


class ModelCall:
    """A provider call's span; ``answered`` records what the provider counted."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def answered(self, done: Completion, cost: Decimal | float | None) -> None:
        if self._span is None:
            return
        attrs: dict[str, Any] = {
            "gen_ai.response.model": done.model,
            "gen_ai.usage.input_tokens": done.usage.input_tokens,
            "gen_ai.usage.output_tokens": done.usage.output_tokens,
            "herd.usage.cached_input_tokens": done.usage.cached_input_tokens,
            "herd.attempts": done.attempts,
        }
        if done.response_id:
            attrs["gen_ai.response.id"] = done.response_id
        if done.finish_reason:
            attrs["gen_ai.response.finish_reasons"] = [done.finish_reason]
        if cost is not None:
            attrs["herd.cost_usd"] = float(cost)  # an attribute is a number, not a Decimal
        self._span.set_attributes(attrs)


@contextmanager
def model_call(provider: str, model: str, source: str = "provider") -> Iterator[ModelCall]:
    """A CLIENT ``chat {model}`` span around one call to the provider; an exception
    leaving it marks the span ERROR."""
    if not ENABLED or not _recording():
        yield ModelCall()
        return
    with _tracer().start_as_current_span(
        f"chat {model}",
        kind=_trace.SpanKind.CLIENT,
        attributes={**_genai(provider, model), "herd.cache.source": source},
    ) as span:
        yield ModelCall(span if span.is_recording() else None)


def model_served(provider: str, model: str, lookup_source: str) -> None:
    """A ``chat {model}`` span for an answer served without a call (exact cache hit,
    singleflight wait): no tokens, no cost, ``herd.cache.source`` says where from.
    Answers that herd computed have their provider calls' spans already."""
    source = SERVED_BY.get(lookup_source)
    if ENABLED and source is not None and _recording():
        attrs = {**_genai(provider, model), "herd.cache.source": source, "herd.cost_usd": 0.0}
        _instant(model, attrs)


def model_batch(provider: str, model: str, usages: Sequence[Usage], *, price: Price | None) -> None:
    """A ``chat {model}`` span for the answers of one provider batch (the Batch API) as
    they are filed: their tokens and cost summed, ``herd.cache.source`` "batch". The
    provider ran the batch for hours, in no process of ours: the span has no duration."""
    if not ENABLED or not usages or not _recording():
        return
    attrs = {
        **_genai(provider, model),
        "herd.cache.source": "batch",
        "herd.batch.requests": len(usages),
        "gen_ai.usage.input_tokens": sum(u.input_tokens for u in usages),
        "gen_ai.usage.output_tokens": sum(u.output_tokens for u in usages),
        "herd.usage.cached_input_tokens": sum(u.cached_input_tokens for u in usages),
    }
    if price is not None:
        attrs["herd.cost_usd"] = float(sum(price.batch_cost(u) for u in usages))
    _instant(model, attrs)


def _instant(model: str, attrs: dict[str, Any]) -> None:
    now = time.time_ns()
    span = _tracer().start_span(
        f"chat {model}", kind=_trace.SpanKind.INTERNAL, start_time=now, attributes=attrs
    )
    span.end(end_time=now)
