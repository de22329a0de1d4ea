"""Corpus ingest: plan, enqueue micro-batches, embed under fenced locks, finalize.

A run streams the files through their chunkers into a temporary table, compares
it with the collection's chunks (added, changed, unchanged, deleted), stores the
new texts, and enqueues what is not yet embedded at its current hash as jobs of
32-64 chunk ids and hashes, one partition (a book, a law) per job. Workers read
the texts from the database, embed them, and upsert the vectors in a
transaction fenced by both the job's lease and the partition's lock. A finalize
job waits until nothing is missing, removes the chunks the run no longer saw
(their replacements exist by then), and swaps a newly built generation in.
Re-running resumes: what was upserted (at its hash) is never embedded again.

A generation records its embedder (``embedder``: the id; ``embedder_spec``: how to
build it again, see ``herd.rag.embedders.spec``), its text-search ``language`` and,
when not pgvector, its vector store (``vectors``: ``HERD_VECTOR_URL``'s location,
part of the fingerprint, so pointing a collection at another store re-indexes it
into a new generation there and swaps it in).
A re-run keeps both unless told otherwise; another ``--embedder`` than the
collection's is refused unless the run asks for a new generation.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb

from herd.app import App
from herd.context import JobContext
from herd.errors import Fatal, HerdError, Retry
from herd.jsonvalue import canonical, check_text, text_problem
from herd.locks import PostgresLocks
from herd.queue.base import JobStatus
from herd.rag.chunkers import FORMATS, ChunkError, get_chunker, place_of
from herd.rag.embedders import spec as specs
from herd.rag.embedders.base import Embedder
from herd.rag.runs import RunStage
from herd.rag.sources import chunk_source, format_of
from herd.rag.store import Generation, RagStore
from herd.rag.vectors import DEFAULT as DEFAULT_STORE

log = logging.getLogger("herd.rag")

EMBED_TASK, FINALIZE_TASK, QUEUE = "herd.rag.embed", "herd.rag.finalize", "embed"
BATCH = 48  # chunks per job: big enough to amortize a round trip, small enough to retry


class IngestError(HerdError):
    """The corpus could not be ingested."""


@dataclass
class Plan:
    collection: str
    generation: int
    new_generation: bool
    added: int = 0
    changed: int = 0
    unchanged: int = 0
    deleted: int = 0
    to_embed: int = 0
    jobs: int = 0
    run: int | None = None
    errors: list[str] = field(default_factory=list)


def fingerprint(
    embedder: Embedder,
    options: dict[str, Any],
    *,
    language: str = "english",
    spec: str = specs.UNRECORDED,
    vectors: str = DEFAULT_STORE,
) -> tuple[str, dict[str, Any]]:
    """What a generation's vectors and lexemes depend on: the embedder, every chunker's
    version, the text-search language and the vector store. The spec (how to build the
    embedder) is recorded, not hashed: a model folder that moves is still the same model."""
    settings: dict[str, Any] = {
        "embedder": embedder.id,
        "dim": embedder.dim,
        "chunkers": {name: factory().version for name, factory in FORMATS.items()},
        "options": options,
        "language": language,
    }
    if vectors != DEFAULT_STORE:  # absent for pgvector: its generations keep their keys
        settings["vectors"] = vectors
    key = hashlib.sha256(canonical(settings).encode()).hexdigest()[:32]
    return key, {**settings, "embedder_spec": spec}


def _part(chunk_id: str, fmt_is_verse: bool, place: str) -> str:
    parts = chunk_id.split("/")
    if fmt_is_verse and len(parts) > 2:
        return "/".join(parts[:2])
    # A plain file's ids start with its place, folders and all: the file is the partition.
    return place if chunk_id.startswith(f"{place}/") else parts[0]


class RagRuntime:
    """A process's corpus resources (store, locks, embedders), opened on first use.

    ``embedder`` is the one new collections get (spec ``specs.NEW_COLLECTIONS``;
    ``app.state["rag.embedder"]`` when set), loaded on first use: a process that
    serves only collections of another embedder never loads it.
    """

    def __init__(
        self,
        store: RagStore,
        locks: PostgresLocks,
        embedder: Embedder | Callable[[], Embedder],
        home: Path | None = None,
    ) -> None:
        self.store, self.locks, self.home = store, locks, home
        self._embedders: dict[str, Embedder] = {}
        self.new_spec = specs.NEW_COLLECTIONS
        if callable(embedder) and not hasattr(embedder, "embed"):
            self._make_default: Callable[[], Embedder] | None = embedder
        else:
            self._make_default = None
            self._embedders[self.new_spec] = embedder  # type: ignore[assignment]
        self._building = asyncio.Lock()
        self._generations: dict[int, Generation] = {}

    @property
    def embedder(self) -> Embedder:
        if self.new_spec not in self._embedders:
            assert self._make_default is not None
            self._embedders[self.new_spec] = self._make_default()
        return self._embedders[self.new_spec]

    async def embedder_for(self, spec: str, recorded: str | None = None) -> Embedder:
        """The embedder a canonical spec names, built once per process (models are big).

        ``recorded`` is the id a generation was indexed with: a kind whose spec names
        several models (see ``specs.variant``) gives the one with that id.
        """
        if spec not in self._embedders:
            async with self._building:
                if spec == self.new_spec:
                    await asyncio.to_thread(lambda: self.embedder)
                elif spec not in self._embedders:
                    built: Embedder = await asyncio.to_thread(specs.build, spec, self.home)
                    self._embedders[spec] = built
        found = self._embedders[spec]
        if recorded in (None, found.id):
            return found
        key = f"{spec}@{recorded}"
        if key not in self._embedders:
            async with self._building:
                if key not in self._embedders:
                    self._embedders[key] = await asyncio.to_thread(
                        specs.variant, spec, found, str(recorded), self.home
                    )
        return self._embedders[key]

    async def generation(self, gen_id: int) -> Generation:
        """A generation as its embed jobs need it, read once per process: its id,
        collection, embedder and store never change (its status does; ask the store)."""
        gen = self._generations.get(gen_id)
        if gen is None:
            gen = self._generations[gen_id] = await self.store.generation(gen_id)
        return gen

    @classmethod
    async def of(cls, app: App) -> RagRuntime:
        runtime = app.state.get("rag")
        if runtime is None:
            async with app.state.setdefault("rag.lock", asyncio.Lock()):
                runtime = app.state.get("rag")
                if runtime is None:
                    url = app.database_url()
                    store = RagStore(url, vector_url=app.settings.vector_url)
                    locks = PostgresLocks(url)
                    await store.open()
                    await locks.open()
                    injected = app.state.get("rag.embedder")
                    runtime = cls(
                        store,
                        locks,
                        injected
                        or functools.partial(specs.build, specs.NEW_COLLECTIONS, app.settings.home),
                        app.settings.home,
                    )
                    app.state["rag"] = runtime

                    async def close() -> None:
                        await locks.close()
                        await store.close()

                    app.on_close(close)
        assert isinstance(runtime, RagRuntime)
        return runtime


async def plan_and_apply(
    app: App,
    paths: Sequence[Path],
    collection: str,
    *,
    fmt: str = "auto",
    apply: bool = True,
    progress: Callable[[int], None] | None = None,
    embedder: str | None = None,
    language: str | None = None,
    new_generation: bool = False,
    changed: Collection[Path] | None = None,
) -> Plan:
    """Compare the files with the collection; with ``apply``, store and enqueue the work.

    ``changed`` (``herd.rag.watch``): of the files under ``paths``, read only these,
    and delete only the chunks of these that are gone (a file deleted, or no longer
    giving a chunk); the rest of the collection is left as it is.

    ``embedder`` (a spec, else ``HERD_EMBEDDER``, else the collection's own, else
    ``specs.NEW_COLLECTIONS``) and ``language`` (a PostgreSQL text-search configuration, else the
    collection's, else the chunkers' when they agree, else ``simple``) choose the
    generation. Another embedder than the collection's is refused unless
    ``new_generation``.
    """
    check_text(collection, "collection")
    rt = await RagRuntime.of(app)
    live = await rt.store.live(collection)
    places, folders, skipped = _expand(paths)
    gone: list[str] = []
    if changed is not None:
        places, gone = _only(places, changed)
        skipped = []  # reported by the full run that came first
        # A path deleted (a file, or a folder with its files) is a prefix too.
        folders = [Path(g) for g in gone]
    spec = await _choose_embedder(collection, live, embedder, new_generation)
    # The live generation's model, when this run keeps its spec (see embedder_for).
    same = live is not None and specs.recorded_spec(live.settings) == spec
    chosen = await rt.embedder_for(spec, live.settings.get("embedder") if same and live else None)
    lang = await _choose_language(rt.store, live, language, places, fmt)
    key, settings = fingerprint(
        chosen, {}, language=lang, spec=spec, vectors=rt.store.vector_url.location
    )
    files = list(places)
    order = {f: i for i, f in enumerate(files)}
    chunk_format = None if fmt == "auto" else fmt
    async with rt.store.stage_run(
        collection, [str(f) for f in files] + gone, [str(d) for d in folders]
    ) as stage:
        errors = skipped + await _load(stage, places, chunk_format, progress, order)
        # A file whose ids are taken (by an earlier file of this run, or in the
        # collection by a file outside this run's scope) is read again with a place
        # that names it alone; ids that name their text stay and are reported below.
        clashing = {Path(p) for p in await stage.clashing_sources()}
        if clashing:
            moved = {f: f"{places[f]}-{_digest(f)}" for f in files if f in clashing}
            await stage.forget(str(f) for f in moved)
            await _load(stage, moved, chunk_format, None, order)
        await _refuse_clashes(stage)
        added, altered, unchanged, deleted = await stage.changes()
        new_gen = live is None or live.fingerprint != key
        plan = Plan(
            collection,
            live.id if live and not new_gen else 0,
            new_gen,
            added=added,
            changed=altered,
            unchanged=unchanged,
            deleted=deleted,
            errors=errors,
        )
        if not apply:
            target = live if live is not None and not new_gen else None
            plan.to_embed = plan.added + plan.changed
            if target is None:
                plan.to_embed = plan.added + plan.changed + plan.unchanged
            return plan
        gen, plan.new_generation = await rt.store.target(collection, key, settings, chosen.dim)
        plan.generation = gen.id
        plan.run = await stage.store(gen.id)
    await enqueue_missing(app, rt, gen, plan)
    return plan


async def enqueue_missing(app: App, rt: RagRuntime, gen: Generation, plan: Plan) -> None:
    """Jobs for every chunk not embedded at its hash, one partition per job; then finalize."""
    missing = await rt.store.missing(gen)
    plan.to_embed = len(missing)
    payloads, keys = [], []
    by_part: dict[str, list[tuple[str, str]]] = {}
    for chunk_id, chunk_hash, part in missing:
        by_part.setdefault(part, []).append((chunk_id, chunk_hash))
    for part, items in by_part.items():
        for start in range(0, len(items), BATCH):
            batch = items[start : start + BATCH]
            payloads.append(
                {
                    "collection": gen.collection,
                    "generation": gen.id,
                    "part": part,
                    "items": [list(i) for i in batch],
                }
            )
            digest = hashlib.sha256(canonical(batch).encode()).hexdigest()[:24]
            keys.append(f"embed:{gen.id}:{digest}")
    results = await app.enqueue_many(EMBED_TASK, payloads, queue=QUEUE, dedup_keys=keys)
    plan.jobs = sum(1 for r in results if r.created)
    await app.enqueue(
        FINALIZE_TASK,
        {"collection": gen.collection, "generation": gen.id, "run": plan.run},
        queue=QUEUE,
        priority=-1,
        dedup_key=f"finalize:{plan.run}",
    )


async def _choose_embedder(
    collection: str, live: Generation | None, asked: str | None, new_generation: bool
) -> str:
    requested = specs.requested(asked)
    current = specs.recorded_spec(live.settings) if live else None
    if requested is None:
        return current or specs.NEW_COLLECTIONS
    spec = specs.canonical(requested)
    if current is not None and spec != current and not new_generation:
        raise IngestError(
            f"collection {collection!r} is indexed with embedder {current}, not {spec}:"
            " add --new-generation to re-index it with that one (queries keep the old"
            " index until the new one is complete)"
        )
    return spec


async def _choose_language(
    store: RagStore,
    live: Generation | None,
    asked: str | None,
    places: dict[Path, str],
    fmt: str,
) -> str:
    if asked is not None:
        known = await store.text_search_configs()
        if asked not in known:
            raise IngestError(
                f"--language {asked!r} is not a text-search configuration of this"
                f" PostgreSQL server; use one of {', '.join(known)}"
            )
        return asked
    if live is not None:
        return live.language
    languages = set()
    for path in places:
        try:
            languages.add(get_chunker(format_of(path, None if fmt == "auto" else fmt)).language)
        except (OSError, ChunkError):
            continue  # reported when the file is read
    return languages.pop() if len(languages) == 1 else "simple"


def _expand(paths: Sequence[Path]) -> tuple[dict[Path, str], list[Path], list[str]]:
    """The files to read with their places (see ``place_of``), the folders, and why any
    file found is skipped. A folder is the root of the files under it; a file given
    by itself is its own."""
    files: dict[Path, str] = {}
    folders: list[Path] = []
    for path in paths:
        path = path.resolve()
        # A name of undecodable bytes: PostgreSQL (UTF-8) cannot record it as a source.
        if text_problem(str(path)):
            raise IngestError(f"{_shown(path)}: the path is not valid UTF-8")
        if path.is_dir():
            folders.append(path)
            for p in sorted(path.rglob("*")):
                if p.is_file() and not p.name.startswith("."):
                    files.setdefault(p, place_of(p, path))
        elif path.is_file():
            files.setdefault(path, place_of(path, path.parent))
        else:
            raise IngestError(f"{path}: no such file or directory")
    skipped = [
        f"{_shown(f)}: the file name is not valid UTF-8" for f in files if text_problem(str(f))
    ]
    return {f: p for f, p in files.items() if not text_problem(str(f))}, folders, skipped


def _only(places: dict[Path, str], changed: Collection[Path]) -> tuple[dict[Path, str], list[str]]:
    """The changed files to read, and the changed paths that are gone (or not files)."""
    wanted = {Path(p).resolve() for p in changed}
    kept = {f: p for f, p in places.items() if f in wanted}
    return kept, sorted(str(p) for p in wanted if p not in kept)


async def _refuse_clashes(stage: RunStage) -> None:
    """Before anything is written: an id two files still share is an error naming both."""
    if shared := await stage.shared_id():
        chunk_id, sources = shared
        raise IngestError(
            f"chunk id {chunk_id!r} comes from both {sources[0]} and {sources[1]}: their ids"
            " name the text, not the file; ingest them into different collections"
        )
    if taken := await stage.taken_id():
        chunk_id, theirs, ours = taken
        raise IngestError(
            f"chunk id {chunk_id!r} of {ours} is already in collection {stage.collection!r},"
            f" from {theirs}: their ids name the text, not the file; ingest {theirs} with"
            " this run to replace it, or use another collection"
        )


def _digest(path: Path) -> str:
    return hashlib.sha256(str(path).encode()).hexdigest()[:8]


async def _load(
    stage: RunStage,
    places: dict[Path, str],
    fmt: str | None,
    progress: Callable[[int], None] | None,
    order: dict[Path, int],
) -> list[str]:
    """Stream every file's chunks into the run table; a bad file is reported, not fatal.

    ``order``: each file's position among those the run was given.
    """
    errors: list[str] = []
    done = 0
    for path, place in places.items():
        try:
            if path.stat().st_size == 0:
                errors.append(f"{path}: the file is empty")
                continue
            rows = 0
            async with stage.file() as copy:
                ord_ = order[path]
                for chunk in chunk_source(path, format=fmt, place=place):
                    verse = "book" in chunk.metadata
                    await copy.write_row(
                        (
                            chunk.id,
                            str(path),
                            _part(chunk.id, verse, place),
                            chunk.text,
                            chunk.breadcrumb,
                            Jsonb(chunk.metadata),
                            chunk.hash,
                            ord_,
                        )
                    )
                    rows += 1
            if rows == 0:
                errors.append(f"{path}: no text to index")
        except ChunkError as exc:
            # The transaction rolled this file back; the other files stay in the run.
            errors.append(f"{path}: {exc}")
        done += 1
        if progress:
            progress(done)
    return errors


def _shown(path: Path) -> str:
    """The path as it can be printed: undecodable bytes as escapes."""
    return str(path).encode("utf-8", "backslashreplace").decode("utf-8")


async def embed_batch(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """The embedding task: texts from the database, vectors back, fenced twice."""
    rt = await RagRuntime.of(ctx.app)
    gen = await rt.generation(payload["generation"])
    embedder = await rt.embedder_for(
        specs.recorded_spec(gen.settings), gen.settings.get("embedder")
    )
    if embedder.id != gen.settings.get("embedder"):
        # Vectors of another model would corrupt the generation: refuse, loudly.
        raise Fatal(
            f"this worker's embedder is {embedder.id}, but generation {gen.id} of"
            f" {gen.collection!r} is indexed with {gen.settings.get('embedder')}"
        )
    items = [(str(i[0]), str(i[1])) for i in payload["items"]]
    current = await rt.store.to_embed(gen, items)
    if not current:
        return {"embedded": 0}  # done already, or changed since: a newer job embeds them
    vectors = await asyncio.to_thread(embedder.embed, [t for _, _, t in current])
    rows = [(cid, h, vectors[i], text) for i, (cid, h, text) in enumerate(current)]
    # The partition lock covers the write, not the embedding: jobs of one book then
    # embed side by side, and only their upserts take turns.
    lock_name = f"rag/{gen.collection}/{gen.id}/{payload['part']}"
    async with (
        rt.locks.hold(lock_name, ttl=30, wait=300) as lock,
        ctx.fenced_transaction(rt.store.transaction) as conn,
    ):
        await rt.locks.assert_held(conn, lock)
        await rt.store.upsert_vectors(conn, gen, rows, lock.token)
    return {"embedded": len(rows)}


async def finalize(payload: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
    """Once nothing is missing: drop what the run no longer saw, swap a new generation in."""
    rt = await RagRuntime.of(ctx.app)
    gen = await rt.store.generation(payload["generation"])
    left = await rt.store.count_missing(gen)
    if left:
        # Counted again after the look for live jobs: the last one may have finished
        # between the first count and the look.
        if not await _embedding_underway(ctx.app, gen.id) and (
            left := await rt.store.count_missing(gen)
        ):
            raise Fatal(
                f"{left} chunks of {gen.collection!r} could not be embedded (see herd dlq list);"
                " requeue those jobs or re-run herd ingest"
            )
        if left:
            # Usually the last embed jobs, claimed just before this one: look again
            # soon (the corpus goes live that much sooner), then once a second.
            raise Retry(f"{left} chunks still to embed", after=_finalize_delay(ctx))
    # Fenced by the job's lease: a finalize that lost it (paused, taken over) deletes
    # nothing and swaps nothing.
    async with ctx.fenced_transaction(rt.store.transaction) as conn:
        gone = await rt.store.finish_run(conn, payload["run"], gen.collection)
    if gone:
        # A store outside the catalogue after its commit; a crash in between leaves
        # vectors without chunks, which searches skip and the next swap removes.
        for active in await rt.store.active(gen.collection):
            await rt.store.delete_vectors(active, gone)
    swapped = False
    if gen.status == "building":
        await rt.store.build_index(gen)
        await rt.store.swap(gen, lambda: ctx.fenced_transaction(rt.store.transaction))
        swapped = True
    dropped = await rt.store.drop_retired(ctx.app.settings.rag_retired_grace)
    return {"deleted": len(gone), "swapped": swapped, "generation": gen.id, "dropped": dropped}


def _finalize_delay(ctx: JobContext) -> float:
    """0.2 s, 0.4 s, 0.8 s, then 1 s between finalize's looks at what is missing."""
    return min(1.0, 0.2 * 2.0 ** min(int(ctx.lease.attempts), 4))


# How many active jobs finalize looks through for its generation's embed jobs.
UNDERWAY_SCAN = 10_000


async def _embedding_underway(app: App, gen_id: int) -> bool:
    for status in (JobStatus.PENDING, JobStatus.PROCESSING):
        jobs = await app.broker.list_jobs(status=status, queue=QUEUE, limit=UNDERWAY_SCAN)
        if any(j.task == EMBED_TASK and j.payload.get("generation") == gen_id for j in jobs):
            return True
        if len(jobs) >= UNDERWAY_SCAN:
            # More active jobs than the scan sees (a corpus of over ~480k chunks):
            # assume some are ours, so finalize waits instead of dead-lettering a
            # run whose jobs are still queued.
            return True
    return False


__all__ = ["Plan", "RagRuntime", "embed_batch", "finalize", "plan_and_apply"]
