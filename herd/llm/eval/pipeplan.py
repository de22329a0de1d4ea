"""A plan before paying for a batch in stages: per stage its pieces, calls, answers the
exact cache holds, tokens and dollars, then the total, the budget's verdict and the time
at the limits; nothing is stored, enqueued or sent.

The split is free and exact: the documents are read and split here as a submission
splits them. The first call stage's inputs are therefore known: each is keyed as its
call will be, looked up in the exact cache, deduplicated, and counted and priced by the
one-prompt plan's estimator (herd.llm.eval.plan.estimate). A later stage reads the
answers before it: where every one of a document's answers is in the cache, its input
is made exactly as the fan-in makes it (herd.llm.eval.stages.advance) and it too is
keyed and looked up; otherwise it is unknown until those answers exist, and its tokens
are estimated: the input's skeleton (each piece's number and location) plus the output
bound of every answer it reads. Such figures are marked estimated.

A reduce larger than its model's context is counted in rounds, grouped by the function
the run groups them by (herd.llm.eval.rounds.group_sizes): every round's calls are in
its stage's figures. A stage through the Batch API is priced at the batch price and is
left out of the time at the limits (the provider paces it).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from herd.app import App
from herd.cache.keys import normalize_document
from herd.durations import duration
from herd.errors import InvalidInput
from herd.jsonvalue import JSON, canonical
from herd.limits import Limit
from herd.limits.tokens import estimate_output, has_tokenizer
from herd.llm.documents import DocumentError
from herd.llm.eval import rounds
from herd.llm.eval.money import as_float, dollars, money
from herd.llm.eval.pipeline import CallStage, FunctionStage, Pipeline
from herd.llm.eval.pipesubmit import check_pipeline
from herd.llm.eval.plan import estimate, minutes_at
from herd.llm.eval.runtime import EvalRuntime
from herd.llm.eval.spec import EvalSpec, reservation_tokens
from herd.llm.eval.split import join_pages, read_pages, split
from herd.llm.eval.stages import text_hash
from herd.llm.eval.submit import check_paths
from herd.llm.providers import registry


@dataclass
class StagePlan:
    """One stage of the plan. For a call stage: its inputs (pieces of a map, documents of
    a reduce or chain), the distinct ones, those the exact cache answers, the calls to
    make and their tokens and dollars; ``estimated`` of the calls read answers not made
    yet (their input is estimated)."""

    name: str
    kind: str
    provider: str = ""
    model: str = ""
    inputs: int = 0
    unique: int = 0
    cached: int = 0
    calls: int = 0
    estimated: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    usd: Decimal | None = None  # None: unpriced (or a split: no call)
    priced: bool = True
    batch_api: bool = False  # through the Batch API: at the batch price
    rounds: int = 1  # a reduce's most rounds over its documents (rounds.group)

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.name, "kind": self.kind, "provider": self.provider or None,
                "model": self.model or None, "inputs": self.inputs, "unique": self.unique,
                "cached": self.cached, "calls": self.calls, "estimated": self.estimated,
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "usd": as_float(self.usd) if self.priced else None,
                "batch_api": self.batch_api, "rounds": self.rounds}  # fmt: skip


@dataclass
class PipelinePlan:
    name: str
    documents: int = 0
    unreadable: list[str] = field(default_factory=list)
    stages: list[StagePlan] = field(default_factory=list)
    tokenizer: str = "rule"  # "registered": every model's own tokenizer counted
    budget: Decimal | None = None
    minutes: float | None = None
    binds: str = ""
    scope: str = ""  # provider:model whose limits bind
    limits: dict[str, int | float] = field(default_factory=dict)

    @property
    def calls(self) -> int:
        return sum(s.calls for s in self.stages)

    @property
    def estimated(self) -> int:
        return sum(s.estimated for s in self.stages)

    @property
    def usd(self) -> Decimal | None:
        """The total; None when a stage that makes calls has no price."""
        if any(not s.priced and s.calls for s in self.stages):
            return None
        return sum((s.usd or Decimal(0) for s in self.stages), Decimal(0))

    def to_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.name,
            "documents": self.documents,
            "unreadable": self.unreadable,
            "stages": [s.to_json() for s in self.stages],
            "calls": self.calls,
            "estimated_calls": self.estimated,
            "input_tokens": sum(s.input_tokens for s in self.stages),
            "output_tokens": sum(s.output_tokens for s in self.stages),
            "tokenizer": self.tokenizer,
            "usd": as_float(self.usd),
            "budget": as_float(self.budget),
            "minutes": None if self.minutes is None else round(self.minutes, 2),
            "binds": self.binds or None,
            "scope": self.scope or None,
            "limits": self.limits,
        }


@dataclass
class _Input:
    """One call's input: known (its text, its key), or estimated (a skeleton text and
    the tokens of the answers it will read)."""

    doc: str  # the document's text hash: identical documents give identical inputs
    text: str
    key: str | None
    extra: int = 0
    loc: dict[str, Any] = field(default_factory=dict)  # a piece's location


def _skeleton(locs: list[dict[str, Any]]) -> str:
    """A reduce's input as the fan-in writes it, each answer left out (counted apart)."""
    return canonical([{"piece": seq, "loc": loc, "answer": None} for seq, loc in enumerate(locs)])


async def _stage(
    rt: EvalRuntime, pipe: Pipeline, stage: CallStage, inputs: list[_Input],
    limits: list[Limit],
) -> tuple[StagePlan, dict[str, JSON], int]:  # fmt: skip
    """The stage's plan, the cached answers of its known inputs (key -> answer), and
    the output bound of one of its calls."""
    spec = pipe.spec(stage)
    plan = StagePlan(stage.name, stage.kind, spec.provider, spec.model, inputs=len(inputs))
    known = {i.key: i for i in inputs if i.key is not None}
    found = await asyncio.gather(*(rt.cache.get(k) for k in known))
    answers = {k: v for k, v in zip(known, found, strict=True) if v is not None}
    # Unknown inputs are distinct per document text (identical documents, identical
    # answers) and per round's batch of a reduce (each its own skeleton).
    unknown = {(i.doc, i.text, i.extra): i for i in inputs if i.key is None}
    todo = [i for k, i in known.items() if k not in answers] + list(unknown.values())
    plan.unique, plan.cached = len(known) + len(unknown), len(answers)
    plan.estimated = len(unknown)
    price = rt.prices.lookup(spec.model, spec.provider)
    counted = estimate(
        spec, [i.text for i in todo], price, default_max=rt.max_tokens,
        batch_api=stage.batch_api,
        has_batch=registry.kind(spec.provider).batch is not None, limits=limits,
        extra=[i.extra for i in todo],
    )  # fmt: skip
    plan.calls = counted.calls
    plan.input_tokens, plan.output_tokens = counted.input_tokens, counted.output_tokens
    # A stage through the Batch API at the batch price (its provider has one: checked).
    plan.usd, plan.priced = counted.usd, price is not None
    plan.batch_api = stage.batch_api
    return plan, answers, _bound(rt, spec)


def _bound(rt: EvalRuntime, spec: EvalSpec) -> int:
    """The output bound of one of the stage's calls: what an answer not made yet counts."""
    _, most = reservation_tokens(spec, "", default_max=rt.max_tokens)
    return estimate_output(spec.params, spec.schema, most)


def _next_inputs(
    pipe: Pipeline, stage: CallStage, nxt: CallStage, per_doc: dict[str, list[_Input]],
    answers: dict[str, JSON], bound: int,
) -> dict[str, list[_Input]]:  # fmt: skip
    """Per document (by name), the next stage's one input: made exactly when every
    answer it reads is cached, else estimated from ``stage``'s output bound."""
    spec = pipe.spec(nxt)
    out: dict[str, list[_Input]] = {}
    for name, ins in per_doc.items():
        if stage.kind != "map":
            ins = ins[-1:]  # a reduce in rounds: the next stage reads its last round's answer
        got = [answers.get(i.key) if i.key is not None else None for i in ins]
        doc = ins[0].doc
        if all(isinstance(a, dict) for a in got):
            value: JSON
            if stage.kind == "map":
                value = [{"piece": seq, "loc": i.loc, "answer": a["output"]}  # type: ignore[index]
                         for seq, (i, a) in enumerate(zip(ins, got, strict=True))]  # fmt: skip
            else:
                value = got[0]["output"]  # type: ignore[index]
            text = canonical(value)
            out[name] = [_Input(doc, text, spec.key(text))]
        elif stage.kind == "map":
            skeleton = _skeleton([i.loc for i in ins])
            out[name] = [_Input(doc, skeleton, None, extra=bound * len(ins))]
        else:
            out[name] = [_Input(doc, "", None, extra=bound)]
    return out


async def _reduce_inputs(
    rt: EvalRuntime, pipe: Pipeline, nxt: CallStage, per_doc: dict[str, list[_Input]],
    answers: dict[str, JSON], bound: int,
) -> tuple[dict[str, list[_Input]], int]:  # fmt: skip
    """Per document, the reduce's calls of every round, its last round's last: what the
    fan-in would write (herd.llm.eval.stages.put_round), grouped by the function rounds
    use (rounds.group_sizes). An answer not made yet (or not cached) is left out of its
    item and counted at its output bound (the map's in round 1, the reduce's after), so
    the grouping of an estimated reduce errs as its tokens do. Returns them and the most
    rounds of a document."""
    spec = pipe.spec(nxt)
    context = pipe.context_of(spec.model)
    own = _bound(rt, spec)
    out: dict[str, list[_Input]] = {}
    most = 1
    for name, ins in per_doc.items():
        doc = ins[0].doc
        # (item, tokens its answer adds beyond the item: 0 when the answer is known)
        items: list[tuple[JSON, int]] = []
        for seq, i in enumerate(ins):
            got = answers.get(i.key) if i.key is not None else None
            answer = got.get("output") if isinstance(got, dict) else None
            items.append(({"piece": seq, "loc": i.loc, "answer": answer},
                          0 if isinstance(got, dict) else bound))  # fmt: skip
        calls: list[_Input] = []
        round_ = 1
        while True:
            sizes = [rounds.item_tokens(item, spec.model) + extra for item, extra in items]
            batches = rounds.group_sizes(sizes, spec, context)
            later: list[tuple[JSON, int]] = []
            for seq, batch in enumerate(batches):
                read = [items[k][0] for k in batch]
                extra = sum(items[k][1] for k in batch)
                text = canonical(read)
                key = spec.key(text) if extra == 0 else None
                calls.append(_Input(doc, text, key, extra=extra))
                if len(batches) > 1:
                    got = await rt.cache.get(key) if key is not None else None
                    answer = got.get("output") if isinstance(got, dict) else None
                    later.append(({"part": seq, "pieces": rounds.span(read), "answer": answer},
                                  0 if isinstance(got, dict) else own))  # fmt: skip
            if len(batches) == 1:
                break
            items, round_ = later, round_ + 1
        most = max(most, round_)
        out[name] = calls
    return out, most


async def plan_documents(
    app: App,
    pipe: Pipeline,
    docs: list[tuple[str, list[str]]],
    *,
    limits: dict[str, Any] | None = None,
    budget: float | None = None,
    batch: str | None = None,
    unreadable: Sequence[str] = (),
    fallbacks: Sequence[str] = (),
) -> PipelinePlan:
    """The plan of (name, pages) documents through ``pipe``, checked as a submission is
    (the fallbacks too; the plan prices each stage's own model)."""
    budget, checked = check_pipeline(pipe, app.settings, budget=budget, limits=limits,
                                     batch=batch, fallbacks=fallbacks)  # fmt: skip
    functions = [s.name for s in pipe.steps if isinstance(s, FunctionStage)]
    if functions:
        # What a function returns is unknown until it runs: the stages after it could
        # only be guessed, and a plan says what it knows.
        raise InvalidInput(
            f"--plan: stage {functions[0]!r} is a function; a pipeline with function stages"
            " is not planned yet (submit without --plan)",
            field="plan",
        )
    rt = await EvalRuntime.of(app)
    plan = PipelinePlan(pipe.name, documents=len(docs) + len(unreadable))
    plan.unreadable, plan.budget = list(unreadable), money(budget)
    first = pipe.calls[0]
    first_spec = pipe.spec(first)
    window = pipe.window_tokens()
    per_doc: dict[str, list[_Input]] = {}
    for name, pages in docs:
        text, ranges = join_pages(pages)
        doc = text_hash(text)
        pieces = split(text, pipe.split if first.kind == "map" else None, window, ranges)
        per_doc[name] = [_Input(doc, p.text, first_spec.key(p.text), loc=p.loc) for p in pieces]
    if pipe.split is not None:
        n = sum(len(v) for v in per_doc.values())
        plan.stages.append(StagePlan(pipe.split.name, "split", inputs=n, unique=n, usd=None))
    own = Limit.from_json(checked or {}, where="limits")
    stage: CallStage | None = first
    made_rounds = 1
    while stage is not None:
        spec = pipe.spec(stage)
        fleet = rt.fleet_limit(spec)
        inputs = [i for ins in per_doc.values() for i in ins]
        found, answers, bound = await _stage(rt, pipe, stage, inputs,
                                             [x for x in (fleet, own) if x])  # fmt: skip
        found.rounds = made_rounds
        plan.stages.append(found)
        nxt = pipe.after(stage.name)
        assert nxt is None or isinstance(nxt, CallStage)  # function stages refused above
        made_rounds = 1
        if nxt is not None and nxt.kind == "reduce":
            per_doc, made_rounds = await _reduce_inputs(rt, pipe, nxt, per_doc, answers, bound)
        elif nxt is not None:
            per_doc = _next_inputs(pipe, stage, nxt, per_doc, answers, bound)
        stage = nxt
    specs = [pipe.spec(s) for s in pipe.calls]
    plan.tokenizer = "registered" if all(has_tokenizer(s.model) for s in specs) else "rule"
    _time(rt, pipe, plan, own)
    return plan


def _time(rt: EvalRuntime, pipe: Pipeline, plan: PipelinePlan, own: Limit) -> None:
    """The time at the limits: the stages' calls and tokens summed per model (the scope
    a limit is kept under), the slowest scope's time, and which of its limits binds."""
    calls: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    specs: dict[tuple[str, str], EvalSpec] = {}
    for stage in plan.stages:
        # A stage through the Batch API is paced by the provider, not by the limits.
        if stage.kind != "split" and not stage.batch_api:
            scope = (stage.provider, stage.model)
            step = pipe.stage(stage.name)
            assert isinstance(step, CallStage)  # function stages refused above
            specs.setdefault(scope, pipe.spec(step))
            calls[scope][0] += stage.calls
            calls[scope][1] += stage.input_tokens + stage.output_tokens
    best: tuple[float, str, str, Limit] | None = None
    for (provider, model), (n, tokens) in calls.items():
        spec = specs[(provider, model)]
        fleet = rt.fleet_limit(spec)
        for limit in (x for x in (fleet, own) if x):
            minutes, binds = minutes_at(limit, n, tokens)
            if minutes is not None and (best is None or minutes > best[0]):
                best = (minutes, binds, f"{provider}:{model}", limit)
    if best is not None:
        plan.minutes, plan.binds, plan.scope, limit = best
        plan.limits = {k: v for k, v in (("rpm", limit.rpm), ("tpm", limit.tpm)) if v}


async def plan_pipeline_paths(
    app: App, paths: Iterable[Path], pipe: Pipeline, **kw: Any
) -> PipelinePlan:
    """The plan of the documents under ``paths``, read and split as a submission does."""
    check_pipeline(pipe, app.settings, budget=kw.get("budget"), limits=kw.get("limits"),
                   batch=kw.get("batch"), fallbacks=kw.get("fallbacks", ()))  # fmt: skip
    docs: list[tuple[str, list[str]]] = []
    errors: list[str] = []
    for path in check_paths(paths):
        try:
            docs.append((str(path), read_pages(path)))
        except DocumentError as exc:
            errors.append(str(exc))
    return await plan_documents(app, pipe, docs, unreadable=errors, **kw)


async def plan_pipeline_texts(
    app: App, pipe: Pipeline, documents: dict[str, str], **kw: Any
) -> PipelinePlan:
    """The same for texts (name -> text), as the HTTP API gives them."""
    docs = [(name, [normalize_document(p) for p in text.split("\f")])
            for name, text in documents.items()]  # fmt: skip
    return await plan_documents(app, pipe, docs, **kw)


def _n(value: int, estimated: bool = False) -> str:
    return ("~" if estimated else "") + f"{value:,}"


def _usd(stage: StagePlan) -> str:
    if stage.kind == "split":
        return "free"
    if not stage.priced:
        return "unpriced"
    return ("~" if stage.estimated else "") + dollars(stage.usd)


def render(plan: PipelinePlan) -> list[str]:
    """The plan as lines of at most 80 columns."""
    docs = f"{plan.documents:,} document{'s' if plan.documents != 1 else ''}"
    lines = [f"plan: pipeline {plan.name[:30]}, {docs}, nothing enqueued or paid",
             f" {'stage':<12} {'kind':<6} {'inputs':>7} {'cached':>7} {'calls':>7}"
             f" {'in tokens':>11} {'out tokens':>10} {'cost':>11}"]  # fmt: skip
    for s in plan.stages:
        name = s.name if len(s.name) <= 12 else s.name[:11] + "…"
        if s.kind == "split":
            lines.append(f" {name:<12} {s.kind:<6} {s.inputs:>7,} {'':>7} {'':>7}"
                         f" {'':>11} {'':>10} {'free':>11}")  # fmt: skip
            continue
        est = s.estimated > 0
        # Inputs unknown until the run cannot be looked up: "-", not a 0 that says missed.
        cached = "-" if s.estimated and s.estimated == s.unique else f"{s.cached:,}"
        lines.append(
            f" {name:<12} {s.kind:<6} {s.inputs:>7,} {cached:>7} {_n(s.calls):>7}"
            f" {_n(s.input_tokens, est):>11} {_n(s.output_tokens, est):>10} {_usd(s):>11}"
        )
    total = plan.usd
    est = plan.estimated > 0
    i = sum(s.input_tokens for s in plan.stages)
    o = sum(s.output_tokens for s in plan.stages)
    cost = "unpriced" if total is None else ("~" if est else "") + dollars(total)
    lines.append(f" {'total':<12} {'':<6} {'':>7} {'':>7} {_n(plan.calls):>7}"
                 f" {_n(i, est):>11} {_n(o, est):>10} {cost:>11}")  # fmt: skip
    if est:
        calls = f"{plan.estimated:,} call{'s' if plan.estimated != 1 else ''}"
        lines.append(f"  ~ estimated: {calls} read answers not made yet;")
        lines.append("    their input counted at the output bound of each answer read")
    for s in plan.stages:
        if s.rounds > 1:
            lines.append(f"  {s.name}: in {s.rounds} rounds, larger than its model's context")
    batched = [s.name for s in plan.stages if s.batch_api]
    if batched:
        lines.append(f"  Batch API: {', '.join(batched)} at the batch price, within 24 h")
    rule = "each model's tokenizer" if plan.tokenizer == "registered" else "herd's rule, errs high"
    lines.append(f"  tokens: {rule}; output at most the bound of each call")
    if plan.unreadable:
        lines.append(f"  {len(plan.unreadable):,} unreadable (named on stderr)")
    if plan.budget is not None:
        short = (total or Decimal(0)) - plan.budget
        note = "covers the plan" if short <= 0 else f"short by {dollars(short)}: it would park"
        lines.append(f"  {'budget':<20}{dollars(plan.budget):>14}  {note}")
    if plan.minutes is None:
        lines.append(f"  {'time at the limits':<20}{'no rpm/tpm':>14}  paced by the provider")
    else:
        limits = ", ".join(f"{k} {v:,}" for k, v in plan.limits.items())
        note = f"{limits}; {plan.binds} binds ({plan.scope})"
        lines.append(f"  {'time at the limits':<20}{duration(plan.minutes * 60):>14}  {note}")
    return [line if len(line) <= 80 else line[:79] + "…" for line in lines]
