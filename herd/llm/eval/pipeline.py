"""What an evaluation in stages is: a pipeline of named stages, read from TOML or made
in Python, checked whole before anything is stored or paid for. No I/O but reading the
file and what it names (prompt and schema files, relative to it).

* ``split``: the document into pieces (herd.llm.eval.split); no model call.
* ``map``: one call per piece; a map after a map reads its answer of the same piece.
* ``reduce``: one call per document over the answers of the map stage before it, in
  document order (in rounds where they pass its model's context: herd.llm.eval.rounds).
* ``chain``: one call per document on the previous stage's answer (a judge, a rewrite).
* ``function``: a Python function (a task registered with ``@app.task``, or any
  importable ``module.fn``) run per piece, as a map, or per document, as a reduce or
  a chain, with no model call.

A single prompt is the one-stage case: ``[map]`` with no split reads the whole document.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from herd.config import Settings
from herd.errors import InvalidInput
from herd.jsonvalue import canonical
from herd.llm.eval.spec import EvalSpec

KINDS = ("split", "map", "reduce", "chain", "function")
# A model's context in tokens where the pipeline names none ([context] in the file).
DEFAULT_CONTEXT = 8192


class _Stage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")]


class SplitStage(_Stage):
    kind: Literal["split"] = "split"
    # pages (PDF pages, form feeds), headings (Markdown), sections (1., 1.2 ...), pasal
    # (a statute: BAB, Pasal, ayat), verse (scripture: book, chapter, verse), window.
    by: Literal["pages", "headings", "sections", "pasal", "verse", "window"] = "headings"
    # Deepest heading or section number that starts a piece (2: "##", "1.2"); pasal: 1
    # BAB, 2 Pasal, 3 ayat; verse: 1 book, 2 chapter, 3 verse.
    depth: Annotated[int, Field(ge=1, le=6)] = 2
    # A window's size in tokens (None: half the context of the first model stage).
    window_tokens: Annotated[int | None, Field(ge=16)] = None
    overlap: Annotated[float, Field(ge=0, lt=0.5)] = 0.1


class CallStage(_Stage):
    kind: Literal["map", "reduce", "chain"]
    prompt: str
    model: str | None = None
    provider: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    params: dict[str, Any] | None = None
    # reduce: the map stage whose answers it reads (default: the map before it).
    over: str | None = None
    # What a dead piece (of a map stage) does to its document: fail it, naming the
    # piece, or let the next stage read the rest with the gap marked.
    on_dead: Literal["fail", "skip"] = "fail"
    # Through the provider's Batch API (herd.llm.eval.pipebatch): the stage's calls of
    # every document ready together go in one provider batch, at the batch price.
    batch_api: bool = False


class FunctionStage(_Stage):
    """A Python function instead of a model call: ``fn(value)`` (sync or async) returns
    the stage's answer, JSON. ``value`` is the piece's or the document's text for the
    first stage, else what a map, reduce or chain in its place would read (the answer
    of the stage before; per document after per-piece stages: the list of their
    answers). Cached by the task's name, ``version`` and what it reads."""

    kind: Literal["function"] = "function"
    # A task's name (@app.task, by default "module.fn") or an importable module.fn.
    task: Annotated[str, Field(pattern=r"^[A-Za-z_][\w.:-]{0,199}$")]
    per: Literal["piece", "document"] = "piece"
    # Part of the cache key: change it when the function's answers change.
    version: Annotated[str, Field(max_length=64)] = "1"
    on_dead: Literal["fail", "skip"] = "fail"


Stage = Annotated[SplitStage | CallStage | FunctionStage, Field(discriminator="kind")]
Step = CallStage | FunctionStage


def per_piece(step: Step) -> bool:
    """Whether the stage runs once per piece (a map, a function per piece), not once
    per document."""
    return step.kind == "map" or (isinstance(step, FunctionStage) and step.per == "piece")


class Defaults(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    provider: str = "openai"
    params: dict[str, Any] = Field(default_factory=dict)


class Pipeline(BaseModel):
    """A pipeline: its stages in order, defaults for their calls, models' contexts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "pipeline"
    defaults: Defaults = Field(default_factory=Defaults)
    context: dict[str, Annotated[int, Field(ge=256)]] = Field(default_factory=dict)
    stages: Annotated[list[Stage], Field(min_length=1)]

    @model_validator(mode="after")
    def _shape(self) -> Pipeline:
        names = [s.name for s in self.stages]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ValueError(f"stage name {dup!r} is used twice")
        kinds = [s.kind for s in self.stages]
        if "split" in kinds[1:]:
            raise ValueError("a split can only be the first stage")
        steps = [s for s in self.stages if not isinstance(s, SplitStage)]
        if not steps:
            raise ValueError("no stage after the split: add a map, reduce, chain or function")
        # Per-piece stages first (maps, functions per piece), then per-document ones: the
        # first of those after per-piece stages reads all their answers (a reduce, or a
        # function per document), the others one answer each.
        last_piece: str | None = None
        seen_doc = False
        for s in steps:
            if per_piece(s):
                if seen_doc:
                    raise ValueError(
                        f"stage {s.name!r}: a {s.kind} per piece must come before any"
                        " stage per document (reduce, chain, function per document)"
                    )
                last_piece = s.name
            elif s.kind == "reduce":
                if last_piece is None:
                    raise ValueError(f"stage {s.name!r}: a reduce needs a map stage before it")
                if seen_doc:
                    raise ValueError(f"stage {s.name!r}: one reduce, right after the maps")
                assert isinstance(s, CallStage)
                if s.over is not None and s.over != last_piece:
                    what = f"reads the last stage per piece, {last_piece!r}"
                    if s.over not in [m.name for m in steps if per_piece(m)]:
                        what = "names no map stage"
                    raise ValueError(f"stage {s.name!r}: over={s.over!r}: {what}")
                seen_doc = True
            else:
                if s.kind == "chain" and last_piece is not None and not seen_doc:
                    raise ValueError(
                        f"stage {s.name!r}: a chain reads one answer per document; put a"
                        " reduce between the map and it"
                    )
                seen_doc = True
            if isinstance(s, CallStage):
                if s.kind != "reduce" and s.over is not None:
                    raise ValueError(f"stage {s.name!r}: only a reduce takes over=")
                if (s.model or self.defaults.model) is None:
                    raise ValueError(f"stage {s.name!r}: no model (set model, or defaults.model)")
        if isinstance(self.stages[0], SplitStage) and last_piece is None:
            raise ValueError("a split needs a map stage after it")
        return self

    # -- what the rest of herd reads ----------------------------------------------------

    @property
    def split(self) -> SplitStage | None:
        first = self.stages[0]
        return first if isinstance(first, SplitStage) else None

    @property
    def steps(self) -> list[Step]:
        """Every stage after the split, in order: what runs on the queue."""
        return [s for s in self.stages if not isinstance(s, SplitStage)]

    def rank(self, stage: str) -> int:
        """A stage's place among the steps (0: the first after the split). Its jobs run
        at the batch's priority plus this: a document's later stage goes ahead of the
        backlog of earlier ones, so its answers come as its pieces end, not after every
        piece of every document (a reduce waited behind the whole map backlog)."""
        return next(n for n, s in enumerate(self.steps) if s.name == stage)

    @property
    def calls(self) -> list[CallStage]:
        """The stages that call a model, in order."""
        return [s for s in self.stages if isinstance(s, CallStage)]

    @property
    def batched(self) -> list[str]:
        """The names of the stages whose calls go through the Batch API."""
        return [s.name for s in self.calls if s.batch_api]

    def through_batch_api(self) -> Pipeline:
        """The same pipeline with every model stage through the Batch API (``--batch-api``
        on the command line). Its calls' keys are unchanged: a stage answered before,
        either way, is answered from the cache."""
        stages = [s.model_copy(update={"batch_api": True}) if isinstance(s, CallStage) else s
                  for s in self.stages]  # fmt: skip
        return self.model_copy(update={"stages": stages})

    def stage(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def after(self, name: str) -> Step | None:
        """The stage that runs after ``name``; None: ``name`` is the last."""
        steps = self.steps
        i = [s.name for s in steps].index(name)
        return steps[i + 1] if i + 1 < len(steps) else None

    @property
    def first(self) -> Step:
        return self.steps[0]

    @property
    def last(self) -> Step:
        return self.steps[-1]

    def reads_text(self, step: Step) -> bool:
        """Whether the stage reads the document's text (the first stage), not answers."""
        return step.name == self.first.name

    def spec(self, stage: CallStage) -> EvalSpec:
        """The stage's call as an EvalSpec: its key is today's key of one call."""
        d = self.defaults
        return EvalSpec(
            model=self.model_of(stage),
            system=stage.prompt,
            schema=stage.schema_,
            provider=stage.provider or d.provider,
            params=stage.params if stage.params is not None else dict(d.params),
        )

    def model_of(self, stage: CallStage) -> str:
        """The stage's model, without building its spec (which checks its schema: a few
        milliseconds a stage on every status poll)."""
        return stage.model or self.defaults.model or ""

    def context_of(self, model: str) -> int:
        return self.context.get(model, DEFAULT_CONTEXT)

    def window_tokens(self) -> int:
        """Tokens per window of the fallback split: as set, or half the first model
        stage's context (the rest for its prompt, its answer and the overlap)."""
        split = self.split
        if split is not None and split.window_tokens is not None:
            return split.window_tokens
        if not self.calls:
            return DEFAULT_CONTEXT // 2
        return self.context_of(self.model_of(self.calls[0])) // 2

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    @property
    def hash(self) -> str:
        return hashlib.sha256(canonical(self.to_json()).encode()).hexdigest()

    def check(self, settings: Settings) -> list[EvalSpec]:
        """Every stage's spec made and checked against the settings (InvalidInput names
        the stage); returns them in stage order."""
        specs = []
        for s in self.calls:
            try:
                spec = self.spec(s)
                spec.check(settings)
            except InvalidInput as exc:
                raise InvalidInput(f"stage {s.name!r}: {exc}", field="pipeline") from None
            specs.append(spec)
        return specs


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
    msg = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


def from_json(value: Any) -> Pipeline:
    """A pipeline from its JSON form (the API's, or a file's parsed): InvalidInput with
    one line naming the field."""
    try:
        return Pipeline.model_validate(value)
    except ValidationError as exc:
        raise InvalidInput(f"pipeline: {_one_line(exc)}", field="pipeline") from None


def _read(base: Path, name: str, what: str) -> str:
    path = base / name
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"pipeline: {what}: {path}: {exc}", field="pipeline") from None


def load(path: Path) -> Pipeline:
    """A pipeline from a TOML file. A stage's ``prompt_file`` and ``schema_file`` are read
    relative to the file (and replaced by ``prompt`` and ``schema``)."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path}: {exc}", field="pipeline") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"{path}: not TOML: {exc}", field="pipeline") from None
    base = path.parent
    for i, stage in enumerate(raw.get("stages") or []):
        if not isinstance(stage, dict):
            continue
        where = f"stages.{i}"
        if "prompt_file" in stage:
            stage["prompt"] = _read(base, str(stage.pop("prompt_file")), f"{where}.prompt_file")
        if "schema_file" in stage:
            text = _read(base, str(stage.pop("schema_file")), f"{where}.schema_file")
            try:
                stage["schema"] = json.loads(text)
            except ValueError as exc:
                raise InvalidInput(
                    f"pipeline: {where}.schema_file: not JSON: {exc}", field="pipeline"
                ) from None
    try:
        return from_json(raw)
    except InvalidInput as exc:
        raise InvalidInput(f"{path}: {exc}", field="pipeline") from None


def single(spec: EvalSpec) -> Pipeline:
    """One prompt as a pipeline: the one-stage case."""
    stage = {"name": "answer", "kind": "map", "prompt": spec.system, "model": spec.model,
             "provider": spec.provider, "schema": spec.schema, "params": spec.params}  # fmt: skip
    return from_json({"stages": [stage]})
