"""Request and response bodies of the HTTP API (they make its OpenAPI schema)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from herd.config import QUERY_CHARS_CEILING, QUERY_K_CEILING, QUERY_TEXTS_CEILING
from herd.errors import InvalidInput
from herd.jsonvalue import check, text_problem
from herd.llm.eval.spec import TASK as EVAL_TASK
from herd.llm.providers import registry
from herd.queue.base import (
    MAX_CONCURRENCY_KEY_LENGTH,
    MAX_DEDUP_KEY_LENGTH,
    MAX_NAME_LENGTH,
    MAX_PRIORITY,
    MAX_RUNNING_PER_KEY,
    MIN_PRIORITY,
    Job,
    JobStatus,
    KeyStats,
    QueueStats,
    RunningJob,
    Throughput,
)
from herd.schedule.ops import ScheduleView


def _storable(value: Any) -> Any:
    # Before pydantic's own checks, so that a lone surrogate is named as one, not as
    # "unable to parse raw data"; a value that is not a string is left to them.
    if isinstance(value, str) and (problem := text_problem(value)):
        raise ValueError(problem)
    return value


# Every string of a request that reaches a store: PostgreSQL refuses a NUL and
# UTF-8 a lone surrogate, which would be a 500 after the request was accepted.
Stored = BeforeValidator(_storable)
SafeText = Annotated[str, Stored]

# Queue names become Redis hash tags ({queue}), where braces would split the slot.
QueueName = Annotated[
    str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[^{}]+$"), Stored
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnqueueIn(Strict):
    task: Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH), Stored]
    payload: Any = None  # depth and size are the app's settings: checked by App.enqueue
    queue: QueueName | None = None
    priority: Annotated[int, Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)] | None = None
    dedup_key: (
        Annotated[str, Field(min_length=1, max_length=MAX_DEDUP_KEY_LENGTH), Stored] | None
    ) = None
    delay: Annotated[float, Field(ge=0, le=366 * 86400)] = 0.0
    # A tenant or user: at most max_running_per_key of its jobs run at once, by turns.
    concurrency_key: (
        Annotated[str, Field(min_length=1, max_length=MAX_CONCURRENCY_KEY_LENGTH), Stored] | None
    ) = None
    max_running_per_key: Annotated[int, Field(ge=1, le=MAX_RUNNING_PER_KEY)] | None = None


class EnqueueOut(BaseModel):
    job_id: int
    created: bool  # False: an active job with the same dedup_key already existed


EXCERPT_CHARS = 200  # of a payload or result in a listing


def excerpt(value: Any) -> str:
    """The start of a value's JSON, for listings: one huge job cannot flood every poll."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:  # stored before depth was capped at enqueue
        return "(nested too deep to show; GET /jobs/{id} has it)"
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


class JobSummaryOut(BaseModel):
    """A job in a listing (GET /jobs, /dlq, /overview): payload and result as excerpts;
    GET /jobs/{id} has them whole, with the traceback."""

    id: int
    task: str
    queue: str
    payload_excerpt: str  # the payload's JSON, cut at EXCERPT_CHARS characters
    status: JobStatus
    priority: int
    dedup_key: str | None
    attempts: int
    stalls: int
    max_attempts: int
    max_stalls: int
    lease_seconds: float
    lease_owner: str | None
    lease_expires_at: datetime | None
    run_at: datetime
    created_at: datetime
    finished_at: datetime | None
    result_excerpt: str | None  # likewise; None until the job succeeded
    last_error: str | None
    dead_reason: str | None
    last_worker: str | None
    # What a person knows the job by, where its task names one: an evaluation's
    # document path (its payload otherwise holds only hashes).
    label: str | None = None

    @classmethod
    def of(cls, job: Job) -> JobSummaryOut:
        fields = {k: getattr(job, k) for k in cls.model_fields if hasattr(job, k)}
        return cls(
            **fields,
            payload_excerpt=excerpt(job.payload),
            result_excerpt=excerpt(job.result) if job.status == JobStatus.SUCCEEDED else None,
            label=label_of(job),
        )


LABEL_CHARS = 300


def label_of(job: Job) -> str | None:
    """An evaluation job's document path (the first document of its key: others
    deduplicated onto it share the job), cut at LABEL_CHARS."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    path = payload.get("path") if job.task == EVAL_TASK else None
    if not isinstance(path, str) or not path:
        return None
    return path if len(path) <= LABEL_CHARS else path[: LABEL_CHARS - 1] + "…"


class JobOut(BaseModel):
    id: int
    task: str
    queue: str
    payload: Any
    status: JobStatus
    priority: int
    dedup_key: str | None
    attempts: int
    stalls: int
    max_attempts: int
    max_stalls: int
    lease_seconds: float
    lease_owner: str | None
    lease_expires_at: datetime | None
    run_at: datetime
    created_at: datetime
    finished_at: datetime | None
    result: Any
    last_error: str | None
    last_traceback: str | None
    dead_reason: str | None
    last_worker: str | None
    concurrency_key: str | None = None

    @classmethod
    def of(cls, job: Job) -> JobOut:
        return cls.model_validate(job, from_attributes=True)


class RequeueIn(Strict):
    job_ids: (
        Annotated[
            list[Annotated[int, Field(ge=1, le=2**63 - 1)]], Field(min_length=1, max_length=10_000)
        ]
        | None
    ) = None
    all: bool = False

    @model_validator(mode="after")
    def _one_of(self) -> RequeueIn:
        if (self.job_ids is not None) == self.all:
            raise ValueError("give job_ids or all=true (not both)")
        return self


class SkippedOut(BaseModel):
    job_id: int
    dedup_key: str
    held_by: int  # the active job that holds the dedup key


class PurgeDeadIn(Strict):
    older_than: Annotated[int, Field(ge=0, le=100 * 366 * 86400)]  # seconds
    queue: QueueName | None = None


class PurgeDeadOut(BaseModel):
    purged: int


class RequeueOut(BaseModel):
    requeued: list[int]
    missing: list[int]  # asked for, but not in the dead-letter queue
    skipped: list[SkippedOut] = []  # left dead: an active job holds their dedup key


class ThroughputOut(BaseModel):
    start: datetime
    minutes: int
    succeeded: list[int]  # all queues, one count per minute from start
    dead: list[int]

    @classmethod
    def of(cls, tp: Throughput) -> ThroughputOut:
        def total(per_queue: dict[str, list[int]]) -> list[int]:
            return [sum(c[i] for c in per_queue.values()) for i in range(tp.minutes)]

        return cls(
            start=tp.start, minutes=tp.minutes, succeeded=total(tp.succeeded), dead=total(tp.dead)
        )


class CacheOut(BaseModel):
    cache: str  # which cache ("exact", later "semantic")
    namespace: str
    entries: int
    hits: int
    misses: int
    hit_rate: float | None  # hits / (hits + misses); None before the first lookup
    counters: dict[str, int]


class ShareOut(BaseModel):
    """A batch using a fleet-wide limit now, and its fair share (herd.limits.Share)."""

    batch: str
    weight: float
    share: float  # its part of the limit's recent use, 0..1
    fair: float  # what its weight entitles it to beside the others, 0..1
    waiting: bool  # its calls wait for capacity now


class LimitOut(BaseModel):
    """A fleet-wide provider limit (provider:model:key id, never the key) and its use."""

    scope: str
    rpm: int | None  # per period (60 s unless the limits file says otherwise)
    tpm: int | None
    max_concurrent: int | None
    period: float
    requests_now: float  # counted in the current period
    tokens_now: float
    in_flight: int
    requests: int  # granted since the limit was first used
    tokens: int
    waits: int  # calls that had to wait for capacity
    wait_seconds: float
    rate_limited: int  # the provider's 429s, each of which paused the limit fleet-wide
    paused_for: float  # seconds the limit stays paused (0: not paused)
    shares: list[ShareOut] = []  # the batches using it now

    @classmethod
    def of(cls, s: Any, now: float) -> LimitOut:
        return cls(
            scope=s.scope,
            rpm=s.limit.rpm,
            tpm=s.limit.tpm,
            max_concurrent=s.limit.max_concurrent,
            period=s.limit.period,
            requests_now=s.requests_now,
            tokens_now=s.tokens_now,
            in_flight=s.in_flight,
            requests=s.requests,
            tokens=s.tokens,
            waits=s.waits,
            wait_seconds=s.wait_seconds,
            rate_limited=s.rate_limited,
            paused_for=max(0.0, (s.paused_until or 0.0) - now),
            shares=[
                ShareOut(
                    batch=f.flow,
                    weight=f.weight,
                    share=round(f.share, 3),
                    fair=round(f.fair, 3),
                    waiting=f.waiting,
                )
                for f in s.shares
            ],  # fmt: skip
        )


class LedgerRow(BaseModel):
    kind: str  # call, lost, failed, cut_short (calls made); cache, singleflight, dedup
    calls: int
    input_tokens: int
    output_tokens: int
    cost: float | None  # paid (call, lost)
    saved: float | None  # estimated: what the avoided calls cost when they were made
    # The provider's prompt cache, apart from herd's: input tokens read from it and
    # written to it, and the money that saved (full input price minus the cost).
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    provider_cache_saved: float | None = None
    # Paid calls of this kind without a price: ``cost`` sums the priced ones alone.
    unpriced: int = 0


class StatsOut(BaseModel):
    queues: list[QueueStats]
    caches: list[CacheOut]


class KeyStatsOut(BaseModel):
    """The busiest concurrency keys (running plus waiting), from counters."""

    keys: list[KeyStats]


class OverviewOut(BaseModel):
    """Everything the dashboard and `herd status` show, in one read."""

    now: datetime
    broker: str
    # The busiest HERD_SHOWN_QUEUES queues, then a "{others}" row summing the rest
    queues: list[QueueStats]
    queues_hidden: int = 0  # how many queues the "{others}" row sums
    running: list[RunningJob]  # soonest lease expiry first
    throughput: ThroughputOut
    dead: list[JobSummaryOut]
    recent: list[JobSummaryOut]
    caches: list[CacheOut]
    ledger: list[LedgerRow]
    limits: list[LimitOut] = []  # the fleet's provider limits, O(limits)
    batches: list[BatchCardOut] = []  # the newest evaluation batches, and parked ones
    schedules: list[ScheduleView] = []  # periodic jobs (herd.schedule), O(schedules)
    keys: list[KeyStats] = []  # the busiest concurrency keys, KEYS_SHOWN at most
    problems: list[str]  # sections that could not be read, and why


# The providers the registry knows: the API's schema lists the same as the CLI.
PROVIDER_PATTERN = "^(" + "|".join(registry.names()) + ")$"
BatchName = Annotated[SafeText, Field(min_length=1, max_length=200)]


class Document(Strict):
    name: Annotated[SafeText, Field(min_length=1, max_length=1000)]
    text: Annotated[SafeText, Field(min_length=1)]


Budget = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class BudgetIn(Strict):
    budget: Budget | None


class EvalIn(Strict):
    # A single prompt (model, system), or a pipeline in stages (herd.llm.eval.pipeline).
    model: Annotated[SafeText, Field(min_length=1, max_length=200)] | None = None
    system: Annotated[SafeText, Field(min_length=1)] | None = None
    pipeline: dict[str, Any] | None = None
    documents: Annotated[list[Document], Field(min_length=1, max_length=10_000)]
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    provider: Annotated[str, Field(pattern=PROVIDER_PATTERN)] = "openai"
    params: dict[str, Any] = Field(default_factory=dict)
    batch: BatchName | None = None
    priority: Annotated[int, Field(ge=-1_000_000, le=1_000_000)] = 0
    # USD the batch's calls may cost (past it its jobs are parked), and its limits.
    budget: Budget | None = None
    rpm: Annotated[int, Field(ge=1)] | None = None
    tpm: Annotated[int, Field(ge=1)] | None = None
    max_concurrent: Annotated[int, Field(ge=1)] | None = None
    # Its share of the provider's limits beside other batches on them (herd.limits.Share).
    weight: Annotated[int, Field(ge=1, le=1000)] | None = None
    # Through the provider's Batch API (herd.llm.eval.batchapi): half the price, within 24 h.
    batch_api: bool = False
    # Enqueue nothing: answer what the submission would cost and take (PlanOut).
    plan: bool = False
    # provider:model, in order, to move to while the model is unavailable.
    fallbacks: Annotated[list[SafeText], Field(max_length=4)] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_kind(self) -> EvalIn:
        if self.pipeline is not None:
            if self.model is not None or self.system is not None or self.json_schema:
                raise ValueError("give a pipeline, or model and system, not both")
        elif self.model is None or self.system is None:
            raise ValueError("give model and system (or a pipeline)")
        return self

    @field_validator("json_schema", "params")
    @classmethod
    def _storable_json(cls, value: Any, info: ValidationInfo) -> Any:
        """The spec is stored as JSON: its keys and strings, at any depth, too."""
        name = info.field_name or "value"
        try:
            check(value, what=cls.model_fields[name].alias or name)
        except InvalidInput as exc:
            raise ValueError(str(exc)) from None
        return value


class EvalOut(BaseModel):
    batch: str
    queued: int
    deduplicated: int
    job_ids: list[int]


class PlanOut(BaseModel):
    """What a submission would do (herd.llm.eval.plan): nothing enqueued or paid. Tokens
    and dollars are those of the calls to make; ``usd`` the path asked for."""

    provider: str
    model: str
    batch_api: bool
    documents: int
    unreadable: list[str]
    unique: int  # distinct evaluations after dedup
    cached: int  # answered by herd's exact cache
    in_flight: int  # queued or running under an earlier submission
    calls: int
    input_tokens: int
    output_tokens: int
    tokenizer: Literal["registered", "rule"]
    prefix_tokens: int  # the shared prefix the provider caches, per call
    provider_cached_input_tokens: int
    provider_cache_share: float
    sync_usd: float | None  # None: the model has no price
    batch_usd: float | None  # None too where the provider has no Batch API
    usd: float | None
    limits: dict[str, float]
    minutes: float | None  # at the limits in force; None: no rpm/tpm binds
    binds: str | None
    budget: float | None


class StagePlanOut(BaseModel):
    stage: str
    kind: Literal["split", "map", "reduce", "chain"]
    provider: str | None  # None: a split (no call)
    model: str | None
    inputs: int  # pieces of a split or map, documents of a reduce or chain
    unique: int
    cached: int  # answered by herd's exact cache (inputs known before the run)
    calls: int
    estimated: int  # of the calls, those whose input is estimated (read answers not made yet)
    input_tokens: int
    output_tokens: int
    usd: float | None  # None: a split, or the model has no price (batch price if batch_api)
    batch_api: bool = False  # through the Batch API: at the batch price
    rounds: int = 1  # a reduce's most rounds over a document (larger than its context)


class PipelinePlanOut(BaseModel):
    """What a pipeline's submission would do (herd.llm.eval.pipeplan), per stage: nothing
    enqueued or paid."""

    pipeline: str
    documents: int
    unreadable: list[str]
    stages: list[StagePlanOut]
    calls: int
    estimated_calls: int
    input_tokens: int
    output_tokens: int
    tokenizer: Literal["registered", "rule"]
    usd: float | None  # None: a stage's model has no price
    budget: float | None
    minutes: float | None  # at the limits in force; None: no rpm/tpm binds
    binds: Literal["rpm", "tpm"] | None
    scope: str | None  # provider:model whose limit binds
    limits: dict[str, float]


class ProviderCacheOut(BaseModel):
    """The provider's prompt cache over a batch's calls, apart from herd's own cache."""

    cached_input_tokens: int = 0  # input tokens read from the provider's cache
    cache_write_tokens: int = 0  # written to it
    saved: float | None = None  # USD: full input price minus the cost; None: not priced


class FailureOut(BaseModel):
    path: str
    job: int
    error: str


class KeyPaidOut(BaseModel):
    """The calls one key of a batch paid for: by its variable where HERD_LIMITS names
    it, else its id (a hash prefix), never the key."""

    key: str
    key_id: str
    calls: int
    cost: float | None = None


class EvalStatusOut(BaseModel):
    batch: str | None
    created_at: str | None = None
    documents: int
    done: int
    dead: int = 0
    failed: int  # dead, and lost (their job gone)
    running: int
    queued: int = 0
    parked_items: int = 0
    cancelled_items: int = 0
    budget: float | None = None
    spent: float | None = None
    reserved: float | None = None
    estimated: float | None = None  # calls cut off mid-call, charged at their worst case
    unpriced: list[str] = []  # models without a price: their cost is unknown, not $0
    parked: str | None = None  # why the batch waits: budget, refused, or cancelled
    parked_reason: str | None = None
    next: str | None = None  # the command that gets it going again
    rate: float | None = None  # documents answered per second, over the last minute
    eta: float | None = None  # seconds
    limits: dict[str, int] = {}
    # Its weight in the fair share of the fleet's limits; the part of a fleet limit's
    # recent use it gets now, and what its weight entitles it to (None: not using one).
    weight: int = 1
    share: float | None = None
    fair_share: float | None = None
    # each with "shares" (the batches using it now) and "key" (its key's variable or id)
    limit_usage: list[dict[str, Any]] = []
    # The calls each key paid for: {key, key_id, calls, cost} (several: a key pool).
    keys: list[KeyPaidOut] = []
    waited_for_limits: float = 0.0
    ledger: dict[str, dict[str, Any]]
    provider_cache: ProviderCacheOut = ProviderCacheOut()
    failures: list[FailureOut] = []
    # A batch in stages: each stage's pieces, done, failed, cached, calls and cost.
    stages: list[dict[str, Any]] = []


class CostOut(BaseModel):
    """A batch's paid calls of one model (or, where the ledger's rows were purged, of
    one ledger kind)."""

    label: str
    calls: int
    input_tokens: int
    output_tokens: int
    cost: float | None  # None: no price known (shown as unpriced, never $0)
    unpriced: bool = False  # some of these calls have no price
    estimated: bool = False  # cut off mid-call: charged at the worst case
    estimated_cost: float | None = None  # of cost: calls cut off mid-call, at the worst case


class StageOut(BaseModel):
    """One stage of a batch in stages (herd.llm.eval.stageview.stage_progress)."""

    stage: str
    kind: str
    model: str
    provider: str | None  # None: a function stage
    pieces: int  # made so far (a later stage's grow as the documents reach it)
    done: int
    failed: int
    cancelled: int
    cached: int  # answered from herd's exact cache
    calls: int  # paid, by the ledger's rows
    input_tokens: int
    output_tokens: int
    cost: float | None  # None: unpriced


class BatchCardOut(BaseModel):
    """A batch as the dashboard's card shows it: progress, money, why it waits."""

    batch: str
    created_at: str | None
    documents: int
    done: int
    dead: int
    lost: int
    running: int
    queued: int
    parked_items: int
    cancelled_items: int
    budget: float | None
    spent: float | None
    reserved: float | None
    estimated: float | None  # of spent: calls cut off mid-call, at their worst case
    unpriced: list[str]
    parked: str | None
    parked_reason: str | None
    next: str | None
    rate: float | None
    eta: float | None
    waited_for_limits: float
    costs_by: Literal["model", "kind"]
    costs: list[CostOut]
    failures: list[FailureOut]  # the first few, by path
    more_failures: int  # failed documents not listed
    stages: list[StageOut] = []  # a batch in stages: each stage's progress and cost


class BatchOut(BaseModel):
    batch: str
    created_at: str
    # running (a job of it leased now), queued (waiting for a worker), done (nothing
    # left to wait for), parked or cancelled
    state: str
    documents: int
    done: int
    failed: int  # dead, lost, or failed in a stage: will not be answered
    running: int  # documents on a job leased now
    parked_items: int
    cancelled_items: int
    budget: float | None
    spent: float | None  # of the priced calls: see unpriced
    unpriced: list[str]  # its models without a price: their calls are not in spent
    parked: str | None
    parked_reason: str | None
    next: str | None


class BatchPage(BaseModel):
    batches: list[BatchOut]
    next: str | None  # the cursor of the next page (older batches), None at the end


class ResultOut(BaseModel):
    path: str
    status: str  # done, dead, lost, queued, running, parked, cancelled
    model: str | None
    source: str | None  # call, cache, dedup, batch
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    cost: float | None
    seconds: float | None
    error: str | None
    output: Any = None


class ResultPage(BaseModel):
    results: list[ResultOut]
    next: str | None  # the path to pass as ?after= for the next page


class BudgetOut(BaseModel):
    batch: str
    budget: float | None
    spent: float
    reserved: float
    parked: str | None
    resumed: int


class CancelOut(BaseModel):
    batch: str
    cancelled_items: int
    provider_batches: list[str]  # provider batches asked to stop
    provider_cancel_failed: list[dict[str, str]]  # their poll jobs ask again


class QueryIn(Strict):
    # The ceilings of HERD_QUERY_MAX_TEXTS, _CHARS and _K; the settings' own bounds
    # (lower by default) are checked by the route (herd.api.queries).
    texts: Annotated[
        list[Annotated[SafeText, Field(min_length=1, max_length=QUERY_CHARS_CEILING)]],
        Field(min_length=1, max_length=QUERY_TEXTS_CEILING),
    ]
    collection: Annotated[SafeText, Field(min_length=1, max_length=200)] = "default"
    k: Annotated[int, Field(ge=1, le=QUERY_K_CEILING)] = 5
    cache: bool = True  # answer from the semantic cache when a close enough query was seen
    tenant: Annotated[SafeText, Field(min_length=1, max_length=200)] = "default"
    # dense: embeddings; lexical: BM25 over words; hybrid: both, fused (herd.rag.query)
    mode: Literal["dense", "lexical", "hybrid"] = "hybrid"


class Hit(BaseModel):
    id: str
    ref: str
    score: float
    text: str
    page: int | None = None  # the first page of a chunk from a PDF (1-based)
    page_end: int | None = None  # and its last


class CacheInfo(BaseModel):
    hit: bool  # answered from the semantic cache
    source: str  # hit, waited, stale, computed or early
    similarity: float | None  # cosine similarity to the cached query, on a hit
    cached_query: str | None


class Answer(BaseModel):
    query: str
    hits: list[Hit]
    cache: CacheInfo | None = None  # None when the request asked for no cache
    # weak: nothing in the collection is close to the query (the embedder's calibrated
    # cosine for unrelated questions), whatever the hits' scores say.
    match: Literal["strong", "weak"] = "strong"


class QueryOut(BaseModel):
    answers: list[Answer]


class HealthOut(BaseModel):
    status: str  # ok or down
    version: str  # herd's
    checks: dict[str, str]  # component -> "ok" or what is wrong


class FieldError(BaseModel):
    field: str  # dotted path in the body, or the parameter's name
    location: str  # body, path, query or header
    reason: str


class ErrorOut(BaseModel):
    """Every 4xx (and the 500 and 503) answer: one line, and for 422 each field at fault."""

    error: str
    errors: list[FieldError] | None = None


OverviewOut.model_rebuild()  # its batches are defined after it
