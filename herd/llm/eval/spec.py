"""What an evaluation is, before anything runs: the spec, its checks, the answer's checks.

No I/O here. Everything a submission can be refused for is checked by these functions,
so the CLI, the HTTP API and Python callers refuse alike, and before anything is paid:
the schema against its meta-schema (and its patterns against a linear-time engine),
the params, a budget, a batch's limits.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

import jsonschema
import re2  # type: ignore[import-untyped]  # google-re2 ships no stubs
from jsonschema.exceptions import SchemaError, ValidationError

from herd.cache import canonical_key
from herd.config import EVAL_MAX_TOKENS, Settings
from herd.errors import InvalidInput
from herd.jsonvalue import JSON, canonical
from herd.limits.base import MAX_WEIGHT
from herd.limits.tokens import estimate_input, requested_max
from herd.llm.params import check_params
from herd.llm.providers import promptcache, registry
from herd.queue.base import MAX_RUNNING_PER_KEY

TASK = "herd.eval"
QUEUE = "eval"
# The Batch API's jobs (herd.llm.eval.batchapi) serve many items and answer none themselves.
SUBMIT_TASK = "herd.eval.batch_submit"
POLL_TASK = "herd.eval.batch_poll"
BATCH_API_TASKS = (SUBMIT_TASK, POLL_TASK)
LIMIT_NAMES = ("rpm", "tpm", "max_concurrent")
# A batch's weight: its part of the fleet's limits beside the other batches on them
# (herd.limits.Share), stored with its limits; 1 when not given.
WEIGHT = "weight"
# A batch's jobs take turns with every other batch's in each claim: they carry their
# batch as a concurrency key whose limit no batch reaches, so the key orders the claims
# (herd.queue: by priority, then the keys in turn) without bounding them. Without it a
# worker claims oldest first, and a small batch submitted behind a big one's backlog
# waits for that backlog's slots before it can ask the limiter for its fair share.
TURNS = MAX_RUNNING_PER_KEY


def turns(batch: str) -> str:
    """The concurrency key of ``batch``'s jobs (herd jobs stats --by-key shows it)."""
    return f"batch:{batch}"


def in_turns(batch: str, n: int) -> dict[str, Any]:
    """``enqueue_many``'s keyword arguments that give ``n`` jobs of ``batch`` its turns."""
    return {"concurrency_keys": [turns(batch)] * n, "max_running_per_key": TURNS}


# An answer longer than this is refused before it is parsed or validated: validation's
# cost grows with the answer, and no evaluation verdict needs a megabyte.
MAX_ANSWER_CHARS = 1_000_000


@dataclass(frozen=True)
class Caller:
    """Who asks to make, change or read a batch. ``owner``: what a batch it makes records
    ('local', or 'token:<hash>' of the bearer token an API caller sent); ``admin``: may
    change any batch (the CLI, Python callers and HERD_API_TOKEN)."""

    owner: str
    admin: bool = False


# The CLI and Python callers: they reach the database themselves, so they are the fleet's
# operator; an API served without tokens (loopback only) acts as them.
LOCAL = Caller("local", admin=True)


class OverBudget(Exception):
    """The next call would pass the batch's budget, or the batch is parked."""


class BatchCancelled(Exception):
    """The batch was cancelled (``herd eval cancel``): no call is made for it any more."""


def check_budget(budget: float | None, field: str = "budget") -> float | None:
    """A budget in USD: a finite number >= 0, or None (no budget)."""
    if budget is None:
        return None
    if (
        isinstance(budget, bool)
        or not isinstance(budget, int | float)
        or not (math.isfinite(budget) and budget >= 0)
    ):
        raise InvalidInput(
            f"{field} must be a finite number of USD >= 0, not {budget!r}", field=field
        )
    return float(budget)


def check_limits(limits: dict[str, Any] | None) -> dict[str, int] | None:
    """A batch's limits: rpm, tpm and max_concurrent, each a positive integer, and its
    weight (a whole number from 1 to MAX_WEIGHT)."""
    if limits is None:
        return None
    out: dict[str, int] = {}
    for name, value in limits.items():
        if name not in (*LIMIT_NAMES, WEIGHT):
            raise InvalidInput(
                f"limits.{name} is not a limit: use {', '.join(LIMIT_NAMES)} or {WEIGHT}",
                field=name,
            )
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(f"{name} must be a positive integer, not {value!r}", field=name)
        if name == WEIGHT and value > MAX_WEIGHT:
            raise InvalidInput(f"weight must be at most {MAX_WEIGHT}, not {value}", field=name)
        out[name] = value
    return out


def own_limits(limits: dict[str, Any] | None) -> tuple[dict[str, Any], int]:
    """A batch's stored limits apart from its weight (1 when not given)."""
    rest = dict(limits or {})
    weight = rest.pop(WEIGHT, None)
    return rest, weight if isinstance(weight, int) and not isinstance(weight, bool) else 1


_RE2 = re2.Options()
_RE2.log_errors = False  # a refused pattern is reported to the user, not logged by absl


@cache
def _regex(pattern: str) -> Any:
    """``pattern`` compiled by RE2, whose matching time is linear in the input: a
    schema's pattern can never freeze a worker (Python's ``re`` backtracks)."""
    try:
        return re2.compile(pattern, _RE2)
    except re2.error as exc:
        detail = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        raise InvalidInput(
            f"schema: pattern {pattern!r} is not supported ({detail}); herd matches patterns"
            " with RE2, which has no backreferences or lookaround",
            field="schema",
        ) from None


def _pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Any:
    if validator.is_type(instance, "string") and not _regex(patrn).search(instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(validator: Any, patterns: dict[str, Any], instance: Any, _: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for patrn, subschema in patterns.items():
        for k, v in instance.items():
            if _regex(patrn).search(k):
                yield from validator.descend(v, subschema, path=k, schema_path=patrn)


def _patterns_of(node: Any) -> list[str]:
    """Every regular expression a schema holds (pattern, patternProperties' keys)."""
    found: list[str] = []
    if isinstance(node, dict):
        if isinstance(node.get("pattern"), str):
            found.append(node["pattern"])
        if isinstance(node.get("patternProperties"), dict):
            found.extend(node["patternProperties"])
        for value in node.values():
            found.extend(_patterns_of(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_patterns_of(value))
    return found


def _validator_class(schema: dict[str, Any]) -> Any:
    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return _with_re2(base)


@cache
def _with_re2(base: Any) -> Any:
    """A draft's validator with RE2's patterns, made once per draft: making the class
    (attrs compiles it) was a tenth of a worker's CPU when done for every answer."""
    return jsonschema.validators.extend(  # type: ignore[no-untyped-call]
        base, {"pattern": _pattern, "patternProperties": _pattern_properties}
    )


def check_schema(schema: Any) -> dict[str, Any] | None:
    """A JSON Schema the answers are checked against: an object valid against its
    meta-schema, every pattern one RE2 compiles. None: no schema."""
    if schema is None:
        return None
    if not isinstance(schema, dict):
        raise InvalidInput("schema must be a JSON object (a JSON Schema)", field="schema")
    try:
        _validator_class(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise InvalidInput(
            f"schema is not a valid JSON Schema at {where}: {exc.message}", field="schema"
        ) from None
    for patrn in _patterns_of(schema):
        _regex(patrn)
    return schema


def validate_answer(text: str, schema: dict[str, Any] | None) -> tuple[JSON, str | None]:
    """The parsed answer and None, or the raw text and what is wrong with it. Without
    a schema nothing asked the model for JSON: a plain-text answer is the answer (a
    JSON string), as a user who gave only a prompt expects, not a failure to pay for
    again."""
    if len(text) > MAX_ANSWER_CHARS:
        return text[:200], f"the answer is longer than {MAX_ANSWER_CHARS:,} characters"
    try:
        value = json.loads(text)
    except ValueError as exc:
        if schema is None:
            return text, None
        return text, f"the answer is not JSON ({exc})"
    if schema is not None:
        try:
            errors = _validator_class(schema)(schema).iter_errors(value)
            error = jsonschema.exceptions.best_match(errors)
        except (InvalidInput, SchemaError) as exc:  # stored before such schemas were refused
            return text, str(exc)
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            return text, f"the answer does not match the schema at {where}: {error.message}"
    return value, None


REPAIR = (
    "{document}\n\n---\nYour previous answer was:\n{answer}\n\nIt was rejected: {error}.\n"
    "Answer again with JSON only, following the schema exactly."
)


@dataclass(frozen=True)
class EvalSpec:
    """Everything besides the document that determines the model's answer."""

    model: str
    system: str
    schema: dict[str, Any] | None = None
    provider: str = "openai"  # a name of herd.llm.providers.registry
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Refused where a spec is made, so the Python API, the CLI and the HTTP API
        # refuse alike; the token bound needs the settings in force: check().
        registry.kind(self.provider)
        check_params(self.params)
        check_schema(self.schema)

    def check(self, settings: Settings) -> None:
        """Refuse params asking for more tokens per call than ``HERD_EVAL_MAX_TOKENS``."""
        check_params(self.params, max_tokens=settings.eval_max_tokens)

    @property
    def hash(self) -> str:
        return hashlib.sha256(canonical(asdict(self)).encode()).hexdigest()

    def key(self, document: str) -> str:
        """The exact cache's key of ``document`` under this spec, as asked of the server
        this process is configured for (the provider's base URL: two servers serving
        one model name answer differently). Computed at submission; a job carries it
        in its payload, so jobs enqueued before the endpoint joined the key still drain
        under theirs. The default public endpoint's keys leave it out: the answers
        cached before it joined were (mostly) its, and paid for, so they keep working
        there; an answer cached from another server under such a key can only be read
        from the public endpoint, until HERD_CACHE_TTL purges it."""
        return canonical_key(
            model=f"{self.provider}:{self.model}",
            system=self.system,
            schema=self.schema,
            # Where the provider reads the prompt from does not change the answer.
            params={k: v for k, v in self.params.items() if k != promptcache.PARAM},
            document=document,
            endpoint=registry.kind(self.provider).endpoint(),
        )


def reservation_tokens(
    spec: EvalSpec, user: str, *, default_max: int = EVAL_MAX_TOKENS
) -> tuple[int, int]:
    """The worst case of one call: (estimated input tokens, the most output tokens
    it may generate). ``default_max``: the setting HERD_EVAL_MAX_TOKENS, the bound
    when the params name none. The input estimate (herd.limits.tokens) never counts
    fewer tokens than the provider, so the reservation errs on the side of the budget."""
    estimate = estimate_input(spec.provider, spec.model, spec.system, user)
    asked = requested_max(spec.params)
    if asked is not None:
        return estimate, asked
    own = registry.kind(spec.provider).default_max_tokens
    return estimate, min(own, default_max) if own else default_max
