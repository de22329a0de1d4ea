"""A plan before paying: what a submission would send, cost and take; nothing is stored,
enqueued or sent.

The same checks as a submission (``check_submission``), the same documents read the
same way, the same keys: the plan counts the documents, the distinct evaluations after
dedup, those the exact cache has answered and those already in flight, and for the
calls left their tokens and dollars.

Tokens are counted by the limiter's estimator (herd.limits.tokens): a tokenizer
registered for the model where there is one, else its conservative rule (three ASCII
characters a token, ~1.3 x what English costs), so a plan without a tokenizer errs
high. Output is the most a call may generate by the same estimator: the schema's bound
or the call's max tokens; an answer shorter than its bound costs less than planned.
Repairs (a second call for an invalid answer) are not planned.

The provider's prompt cache is planned as the providers document theirs (and the
simulator keeps it, herd/testing/simulator/promptcache.py): the shared prefix is the
system prompt; OpenAI caches one of 1,024 tokens or more by itself, in 128-token steps,
the first call writing it at no premium; Anthropic caches it where herd marks it
(prompt_cache on, past the model's minimum), the first call writing at the write rate.
Every later call reads it. Money is summed call by call as exact decimals, as the
ledger sums it (herd.llm.eval.money).

The time is the one the limits in force allow (HERD_LIMITS's entry for the provider,
model and key, and the batch's own --rpm/--tpm): requests over rpm, tokens (input plus
the output bound, what the limiter reserves) over tpm, whichever binds. The Batch API's
time is the provider's (within 24 h).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from herd.app import App
from herd.cache.keys import normalize_document
from herd.durations import duration
from herd.limits import Limit
from herd.limits.tokens import (
    count_text,
    estimate_input,
    estimate_output,
    has_tokenizer,
    requested_max,
    schema_bound,
)
from herd.llm.completion import Usage
from herd.llm.documents import DocumentError, read_document
from herd.llm.eval.money import as_float, dollars, money
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.spec import EvalSpec, own_limits, reservation_tokens
from herd.llm.eval.submit import check_paths, check_submission, in_flight
from herd.llm.pricing import Price
from herd.llm.providers import promptcache, registry

OPENAI_STEP = 128  # OpenAI caches a prefix in steps of this many tokens
BATCH_WINDOW = "within the provider's 24 h window"


@dataclass
class Plan:
    """What a submission would do. Token and dollar figures are those of the calls to
    make (the documents neither deduplicated, cached nor in flight)."""

    provider: str
    model: str
    batch_api: bool
    documents: int = 0
    unreadable: list[str] = field(default_factory=list)
    unique: int = 0
    cached: int = 0  # answered by herd's exact cache
    in_flight: int = 0  # queued or running under an earlier submission
    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    tokenizer: str = "rule"  # "registered": the model's own tokenizer counted them
    prefix_tokens: int = 0  # the shared prefix the provider caches, per call (0: none)
    cached_input_tokens: int = 0  # of input_tokens, read from the provider's cache
    sync_usd: Decimal | None = None
    batch_usd: Decimal | None = None  # None too where the provider has no Batch API
    limits: dict[str, int | float] = field(default_factory=dict)
    minutes: float | None = None  # at the limits in force; None: no rpm/tpm binds
    binds: str = ""  # "rpm" or "tpm"
    budget: Decimal | None = None  # the batch's budget, where one is given
    # What bounds an answer's length: "params" (max_tokens), "schema" (its lengths), or
    # "nothing" (the model's default max: the output tokens and dollars are a ceiling).
    output_bound: str = "nothing"

    @property
    def cache_share(self) -> float:
        return self.cached_input_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def usd(self) -> Decimal | None:
        """The dollars of the path this submission takes."""
        return self.batch_usd if self.batch_api else self.sync_usd

    def to_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "model": self.model,
            "batch_api": self.batch_api,
            "documents": self.documents,
            "unreadable": self.unreadable,
            "unique": self.unique,
            "cached": self.cached,
            "in_flight": self.in_flight,
            "calls": self.calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "tokenizer": self.tokenizer,
            "prefix_tokens": self.prefix_tokens,
            "provider_cached_input_tokens": self.cached_input_tokens,
            "provider_cache_share": round(self.cache_share, 4),
            "sync_usd": as_float(self.sync_usd),
            "batch_usd": as_float(self.batch_usd),
            "usd": as_float(self.usd),
            "limits": self.limits,
            "minutes": None if self.minutes is None else round(self.minutes, 2),
            "binds": self.binds or None,
            "budget": as_float(self.budget),
            "output_bound": self.output_bound,
        }


def prefix_tokens(spec: EvalSpec) -> int:
    """Tokens of the shared prefix the provider will cache for every call after the
    first; 0 where it caches none (too short, or not marked)."""
    if not spec.system:
        return 0
    tokens = count_text(spec.system, spec.model)
    if spec.provider == "anthropic":
        on, _ = promptcache.take_switch(spec.params, True)
        minimum = promptcache.anthropic_min_tokens(spec.model)
        marked = on and promptcache.long_enough(spec.provider, spec.model, spec.system, minimum)
        return tokens if marked and tokens >= minimum else 0
    if tokens < promptcache.OPENAI_MIN_TOKENS:
        return 0
    return tokens - tokens % OPENAI_STEP


def _usage(spec: EvalSpec, i: int, o: int, prefix: int, first: bool) -> Usage:
    """One call's expected usage; the first call writes the prefix, the others read it."""
    if not prefix:
        return Usage(i, o)
    if first:
        # OpenAI writes its cache at no premium and reports nothing of it.
        return Usage(i, o, cache_write_tokens=prefix if spec.provider == "anthropic" else 0)
    return Usage(i, o, cached_input_tokens=min(prefix, i))


def minutes_at(limit: Limit, requests: int, tokens: int) -> tuple[float | None, str]:
    """Minutes ``requests`` calls of ``tokens`` tokens take under ``limit`` (rpm and tpm
    per its period), and which binds; None when neither is set."""
    found: list[tuple[float, str]] = []
    if limit.rpm:
        found.append((requests / limit.rpm * limit.period / 60, "rpm"))
    if limit.tpm:
        found.append((tokens / limit.tpm * limit.period / 60, "tpm"))
    return max(found) if found else (None, "")


def estimate(
    spec: EvalSpec,
    texts: Iterable[str],
    price: Price | None,
    *,
    default_max: int,
    batch_api: bool,
    has_batch: bool,
    limits: Iterable[Limit] = (),
    extra: Sequence[int] = (),
) -> Plan:
    """The calls of ``texts`` (one each, deduplicated already) counted and priced. No I/O.
    ``extra``: tokens to add to each call's input, by position (a pipeline's later stage
    whose input is estimated: its skeleton's text plus the answers' output bounds)."""
    plan = Plan(spec.provider, spec.model, batch_api)
    plan.tokenizer = "registered" if has_tokenizer(spec.model) else "rule"
    if requested_max(spec.params) is not None:
        plan.output_bound = "params"
    elif spec.schema is not None and schema_bound(spec.schema, spec.schema) is not None:
        plan.output_bound = "schema"
    prefix = prefix_tokens(spec)
    sync: Decimal | None = None if price is None else Decimal(0)
    batch: Decimal | None = None if price is None or not has_batch else Decimal(0)
    reserved = 0
    for n, text in enumerate(texts):
        i = estimate_input(spec.provider, spec.model, spec.system, text)
        i += extra[n] if n < len(extra) else 0
        _, most = reservation_tokens(spec, text, default_max=default_max)
        o = estimate_output(spec.params, spec.schema, most)
        usage = _usage(spec, i, o, prefix, first=n == 0)
        plan.calls += 1
        plan.input_tokens += i
        plan.output_tokens += o
        plan.cached_input_tokens += usage.cached_input_tokens
        reserved += i + o
        if price is not None:
            sync = (sync or Decimal(0)) + price.cost(usage)
            if batch is not None:
                batch += price.batch_cost(usage)
    plan.prefix_tokens = prefix if plan.calls > 1 else 0
    plan.sync_usd, plan.batch_usd = sync, batch
    if not batch_api:
        times = [(minutes_at(limit, plan.calls, reserved), limit) for limit in limits]
        bound = [(t, limit) for t, limit in times if t[0] is not None]
        if bound:
            (plan.minutes, plan.binds), limit = max(bound, key=lambda x: x[0][0] or 0.0)
            plan.limits = {k: v for k, v in (("rpm", limit.rpm), ("tpm", limit.tpm)) if v}
            if limit.period != 60.0:
                plan.limits["period"] = limit.period
    return plan


async def plan_items(
    app: App,
    spec: EvalSpec,
    items: list[tuple[str, str]],
    *,
    batch_api: bool = False,
    limits: dict[str, Any] | None = None,
    budget: float | None = None,
    batch: str | None = None,
    unreadable: list[str] | None = None,
    fallbacks: Sequence[str] = (),
) -> Plan:
    """The plan of (name, normalized text) items, checked as a submission is (the
    fallbacks too; the plan prices the batch's own model)."""
    budget, checked = check_submission(spec, app.settings, budget=budget, limits=limits,
                                       batch_api=batch_api, batch=batch,
                                       fallbacks=fallbacks)  # fmt: skip
    rt = await EvalRuntime.of(app)
    keys = {spec.key(text): text for _, text in items}
    found = await asyncio.gather(*(rt.cache.get(k) for k in keys))
    cached = {k for k, v in zip(keys, found, strict=True) if v is not None}
    flying = {k for k, _ in await in_flight(app, spec, [k for k in keys if k not in cached])}
    todo = [text for k, text in keys.items() if k not in cached and k not in flying]
    fleet = rt.fleet_limit(spec)  # a key pool's: its keys' limits added up
    own = Limit.from_json(own_limits(checked)[0], where="limits")
    plan = estimate(
        spec, todo, rt.prices.lookup(spec.model, spec.provider), default_max=rt.max_tokens,
        batch_api=batch_api, has_batch=registry.kind(spec.provider).batch is not None,
        limits=[x for x in (fleet, own) if x],
    )  # fmt: skip
    plan.budget = money(budget)
    plan.documents = len(items) + len(unreadable or [])
    plan.unreadable = list(unreadable or [])
    plan.unique, plan.cached, plan.in_flight = len(keys), len(cached), len(flying)
    return plan


async def plan_paths(
    app: App,
    paths: Iterable[Path],
    spec: EvalSpec,
    *,
    batch_api: bool = False,
    limits: dict[str, Any] | None = None,
    budget: float | None = None,
    batch: str | None = None,
    fallbacks: Sequence[str] = (),
) -> Plan:
    """The plan of the documents under ``paths``, read as ``submit`` reads them."""
    check_submission(spec, app.settings, budget=budget, limits=limits, batch_api=batch_api,
                     batch=batch, fallbacks=fallbacks)  # fmt: skip
    items: list[tuple[str, str]] = []
    errors: list[str] = []
    for path in check_paths(paths):
        try:
            items.append((str(path), normalize_document(read_document(path))))
        except DocumentError as exc:
            errors.append(str(exc))
    return await plan_items(app, spec, items, batch_api=batch_api, limits=limits,
                            budget=budget, batch=batch, unreadable=errors,
                            fallbacks=fallbacks)  # fmt: skip


def _n(value: int) -> str:
    return f"{value:,}"


def render(plan: Plan) -> list[str]:
    """The plan as lines of at most 80 columns."""
    per = plan.input_tokens // plan.calls if plan.calls else 0
    out_per = plan.output_tokens // plan.calls if plan.calls else 0
    counted = "its tokenizer" if plan.tokenizer == "registered" else "herd's rule, errs high"
    path = "Batch API" if plan.batch_api else "synchronous"
    rows = [
        ("documents", _n(plan.documents),
         f"{len(plan.unreadable)} unreadable" if plan.unreadable else ""),
        ("unique after dedup", _n(plan.unique), ""),
        ("answered (cache)", _n(plan.cached), "herd's exact cache: free"),
        ("already in flight", _n(plan.in_flight), "joins the earlier jobs"),
        ("calls to make", _n(plan.calls), path),
        ("input tokens", _n(plan.input_tokens), f"~{_n(per)} a call; {counted}"),
        ("output tokens", _n(plan.output_tokens), f"at most ~{_n(out_per)} a call"),
        ("provider cache", f"{plan.cache_share:.0%}",
         f"of the input; a {_n(plan.prefix_tokens)}-token shared prefix"
         if plan.prefix_tokens else "of the input; no shared prefix to cache"),
        ("cost, synchronous", dollars(plan.sync_usd), "" if plan.batch_api else "<- this run"),
        ("cost, Batch API",
         dollars(plan.batch_usd, unpriced="not offered" if plan.sync_usd is not None
                 else "unpriced"),
         "<- this run" if plan.batch_api else ""),
    ]  # fmt: skip
    if plan.budget is not None:
        short = (plan.usd or Decimal(0)) - plan.budget
        note = "covers the plan" if short <= 0 else f"short by {dollars(short)}: it would park"
        rows.append(("budget", dollars(plan.budget), note))
    if plan.batch_api:
        rows.append(("time", "<= 24 h", BATCH_WINDOW))
    elif plan.minutes is None:
        rows.append(("time at the limits", "no rpm/tpm", "paced by the provider and workers"))
    else:
        limits = ", ".join(f"{k} {v:,}" for k, v in plan.limits.items())
        note = f"{limits}; {plan.binds} binds"
        rows.append(("time at the limits", duration(plan.minutes * 60), note))
    lines = [f"plan: {plan.provider}:{plan.model}, nothing enqueued or paid"]
    for name, value, note in rows:
        line = f"  {name:<20}{value:>14}  {note}".rstrip()
        lines.append(line if len(line) <= 80 else line[:79] + "…")
    if plan.calls and plan.output_bound == "nothing":
        # Output is priced at four times input or more, so an unbounded answer makes the
        # plan a ceiling many times the bill (a claim-and-score answer of ~15 tokens was
        # planned at 16,384: $0.07 for a $0.004 run). Said, with the way to bound it.
        lines += [
            "  nothing bounds an answer's length, so output and cost are a ceiling:",
            '  add "max_tokens" to --params (or maxLength to the schema) for a closer plan',
        ]
    return lines
