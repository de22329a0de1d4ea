"""A provider's rate limits: herd with limits set, herd without, Celery's ``rate_limit``.

The simulator (``python -m herd.testing.simulator``) enforces 600 requests and 200,000 tokens
per minute (token buckets per key and model that start full and refill continuously, as
OpenAI and Anthropic describe theirs), with 0.2-0.5 s latency. 2,000 evaluation requests
(about 170 tokens of prompt and document, ``max_tokens`` 64: about 235 tokens charged a
call, so tokens bind less than requests: 600 x 235 = 141,000 a minute) run on 4 worker
processes with 16 calls in flight each:

* ``herd-limits``: ``herd eval submit ... --rpm 600 --tpm 200000`` (the limits stored
  with the batch, enforced fleet-wide); skipped with a message if this herd refuses
  those flags.
* ``herd-nolimits``: the same without them: herd's providers retry 429s (Retry-After).
* ``celery-150`` / ``celery-600``: a Celery task with ``rate_limit='150/m'`` (a fair
  share of 600 over 4 workers: Celery's limit is per worker) or ``'600/m'``; ``--pool
  threads --concurrency 16``; a 429 is retried with ``self.retry(countdown=Retry-After)``.

Figures: 429s the simulator sent for its limits, provider calls it received, calls billed
(began generating), wall time from submission to the last answer, and wall / ideal, the
ideal being the calls at the steady rate (2,000 at 600/min: 200 s). A full bucket lets a
fresh key burst its whole minute first, so (N - rpm) / rpm minutes is the floor.

    python bench/rate_limits.py [--variants herd-limits,herd-nolimits,celery-150,celery-600]
        [--docs 2000] [--rpm 600] [--tpm 200000] [--quick] [--summary PATH] [--keep]

``--quick``: 200 documents at 150 rpm (50,000 tpm; about 20 s a variant past the burst).
Celery's variants need Celery: run the script from the venv of ``.[test,bench-celery]``
(bench/README.md). Everything listens on 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for extra in (REPO, REPO / "bench"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import _summary  # noqa: E402
from eval_cost import (  # noqa: E402
    SimulatorProcess,
    _tail,
    celery_fleet,
    eval_fleet,
    herd_env,
)

from herd.testing.fleet import worker_env  # noqa: E402

MODEL = "sim-1"
MAX_TOKENS = 64
VARIANTS = ("herd-limits", "herd-nolimits", "celery-150", "celery-600")
PROMPT = "Rate the clarity of this note from 1 to 5 and summarize it in one sentence. JSON only."
SCHEMA: dict[str, Any] = {
    "title": "Rating",
    "type": "object",
    "properties": {
        "clarity": {"type": "integer", "minimum": 1, "maximum": 5},
        "summary": {"type": "string", "maxLength": 120},
    },
    "required": ["clarity", "summary"],
    "additionalProperties": False,
}
WORDS = (
    "ledger", "contract", "river", "harvest", "signal", "archive", "committee", "budget",
    "engine", "winter", "clause", "measure", "survey", "council", "border", "witness",
    "the", "of", "and", "to", "a", "in", "is", "that", "for", "with", "on", "from",
)  # fmt: skip


def make_documents(n: int, seed: int) -> list[str]:
    """``n`` distinct notes of about 600 characters (~150 tokens at 4 characters each)."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words: list[str] = [f"Note {i}."]
        while sum(len(w) + 1 for w in words) < 600:
            words.append(rng.choice(WORDS))
        docs.append(" ".join(words) + ".")
    return docs


@dataclass
class Result:
    variant: str
    seconds: float
    documents: int
    done: int
    sim: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def rate_limited(self) -> int:
        return int(self.sim.get("rate_limited", 0))

    @property
    def calls(self) -> int:
        return int(self.sim.get("calls", 0))

    @property
    def billed(self) -> int:
        return int(self.sim.get("billed", 0))


def simulator(args: argparse.Namespace, log: Path) -> SimulatorProcess:
    """A simulator with the provider's limits."""
    limits = ("--rpm", str(args.rpm), "--tpm", str(args.tpm))
    return SimulatorProcess(args.latency, args.seed, log, limits)


def _progress(
    name: str, t0: float, sim: SimulatorProcess, last: list[float], done: str = ""
) -> None:
    now = time.monotonic()
    if now - last[0] >= 15:
        last[0] = now
        st = sim.stats()
        print(
            f"  {name} {now - t0:5.0f}s: {done}{st['calls']} calls, {st['rate_limited']} 429s",
            file=sys.stderr,
            flush=True,
        )


# --------------------------------------------------------------------------- herd


def run_herd(args: argparse.Namespace, variant: str, docs: Path, tmp: Path) -> Result:
    from herd.embedded import embedded_server

    n = len(list(docs.iterdir()))
    home = tmp / f"home-{variant}"
    server = embedded_server(home)
    url = server.acquire()
    logs = tmp / "logs"
    # Whatever this run starts stops when it ends, in the reverse order.
    stack = contextlib.ExitStack()
    try:
        sim = stack.enter_context(simulator(args, logs / f"sim-{variant}.log"))
        env = herd_env(home, url, sim)
        herd = [sys.executable, "-m", "herd"]
        submit = [
            *herd, "eval", "submit", str(docs), "--prompt", str(tmp / "prompt.txt"),
            "--schema", str(tmp / "schema.json"), "--model", MODEL,
            "--params", json.dumps({"max_tokens": MAX_TOKENS}), "--batch", variant, "--json",
        ]  # fmt: skip
        if variant == "herd-limits":
            submit += ["--rpm", str(args.rpm), "--tpm", str(args.tpm)]
        fleet = stack.enter_context(eval_fleet(env, logs, f"{variant}-worker", args.concurrency))
        fleet.start(args.workers)
        time.sleep(1.0)  # let the workers connect: the clock starts with the submission
        t0 = time.monotonic()
        out = subprocess.run(submit, env=env, cwd=REPO, capture_output=True, timeout=600)
        if out.returncode != 0:
            err = out.stderr.decode(errors="replace").strip()
            if variant == "herd-limits" and ("--rpm" in err or "No such option" in err):
                fleet.stop()
                why = "this herd's `herd eval submit` has no --rpm/--tpm yet"
                return Result(variant, 0.0, n, 0, {}, skipped=why)
            raise RuntimeError(f"herd eval submit failed: {err[-2000:]}")
        # Followed as a user follows it: one `herd eval wait`, which reads the batch's
        # status in its own process. A `herd eval status` process per poll cost about
        # 1.7 CPU-seconds each (an interpreter and herd's imports), charged to herd's
        # CPU and wall time on 2 cores.
        last = [0.0]
        with (logs / f"{variant}-wait.json").open("wb") as end_status, \
                (logs / f"{variant}-wait.log").open("wb") as log:  # fmt: skip
            waiter = subprocess.Popen([*herd, "eval", "wait", variant, "--json"], env=env,
                                      cwd=REPO, stdout=end_status, stderr=log)  # fmt: skip
        deadline = t0 + args.deadline
        try:
            while waiter.poll() is None and time.monotonic() < deadline:
                _progress(variant, t0, sim, last)
                for m in fleet.exited():
                    raise RuntimeError(
                        f"{variant} worker {m.seq} exited {m.popen.returncode}:\n{_tail(m.log)}"
                    )
                time.sleep(0.5)
        finally:
            if waiter.poll() is None:  # the deadline, or a worker gone
                waiter.terminate()
                waiter.wait()
        text = (logs / f"{variant}-wait.json").read_text()
        if not text.strip():  # cut off at the deadline: where the batch got to
            argv = [*herd, "eval", "status", variant, "--json"]
            text = subprocess.run(
                argv, env=env, cwd=REPO, capture_output=True, timeout=60
            ).stdout.decode()
        status: dict[str, Any] = json.loads(text) if text.strip() else {}
        seconds = time.monotonic() - t0
        stats = sim.stats()
        fleet.stop(timeout=15)
        notes = [f"{status.get('failed', 0)} dead-lettered"] if status.get("failed") else []
        return Result(variant, seconds, n, int(status.get("done", 0)), stats, notes)
    finally:
        stack.close()
        server.release()


# --------------------------------------------------------------------------- Celery


def run_celery(args: argparse.Namespace, variant: str, docs: Path, tmp: Path) -> Result:
    try:
        import redis

        from bench import _celery_ratelimit
    except ImportError as exc:
        return Result(variant, 0.0, 0, 0, {}, skipped=f"no Celery in this venv ({exc})")
    from herd.testing.servers.redis_stack import RedisStackServer

    rate = variant.split("-", 1)[1] + "/m"
    files = sorted(docs.iterdir())
    n = len(files)
    logs = tmp / "logs"
    server = RedisStackServer(REPO / ".herd-test" / "cache", tmp / f"redis-{variant}", modules=())
    stack = contextlib.ExitStack()
    try:
        server.start()
        sim = stack.enter_context(simulator(args, logs / f"sim-{variant}.log"))
        r = stack.enter_context(redis.Redis.from_url(server.url))
        env = worker_env(
            pythonpath=[REPO],
            BENCH_CELERY_BROKER=server.url,
            BENCH_SIM_URL=sim.url,
            BENCH_RATE_LIMIT=rate,
        )
        fleet = stack.enter_context(celery_fleet(
            "bench._celery_ratelimit", _celery_ratelimit.QUEUE, "threads", args.concurrency,
            env, logs, f"{variant}-worker",
        ))  # fmt: skip
        fleet.start(args.workers)
        app = _celery_ratelimit.make_app(server.url)
        stack.callback(app.close)
        system = PROMPT
        time.sleep(3.0)  # Celery workers take a few seconds to start consuming
        t0 = time.monotonic()
        with app.producer_or_acquire() as producer:
            for path in files:
                body = {
                    "model": MODEL,
                    "max_tokens": MAX_TOKENS,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "Rating", "schema": SCHEMA, "strict": True},
                    },
                    "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": path.read_text(encoding="utf-8")},
                    ],
                    "stream": False,
                }
                app.send_task(
                    _celery_ratelimit.TASK,
                    args=(path.name, body),
                    queue=_celery_ratelimit.QUEUE,
                    producer=producer,
                )
        last = [0.0]
        deadline = t0 + args.deadline
        done = 0
        while time.monotonic() < deadline:
            done = int(r.hlen(_celery_ratelimit.RESULTS))
            if done >= n:
                break
            _progress(variant, t0, sim, last, f"{done}/{n} done, ")
            time.sleep(0.25)
        seconds = time.monotonic() - t0
        stats = sim.stats()
        fleet.stop(timeout=15)
        return Result(variant, seconds, n, done, stats, [f"rate_limit={rate!r} per worker"])
    finally:
        stack.close()
        server.stop()


# --------------------------------------------------------------------------- report


def report(results: list[Result], args: argparse.Namespace) -> None:
    ideal = args.docs * 60.0 / args.rpm
    floor = max(0, args.docs - args.rpm) * 60.0 / args.rpm
    print(
        f"{args.docs} evaluations, simulator limited to {args.rpm} rpm / {args.tpm} tpm,"
        f" latency {args.latency} s; {args.workers} worker processes x {args.concurrency}"
        f" in flight. Ideal at the steady rate {ideal:.0f} s (the bucket's burst: floor"
        f" {floor:.0f} s)\n"
    )
    head = (
        f"{'variant':14} {'429s':>6} {'calls':>6} {'billed':>6} {'429 %':>6} {'done':>10}"
        f" {'wall s':>7} {'wall/ideal':>10}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        if r.skipped:
            print(f"{r.variant:14} skipped: {r.skipped}")
            continue
        share = 100.0 * r.rate_limited / max(1, r.calls)
        print(
            f"{r.variant:14} {r.rate_limited:>6} {r.calls:>6} {r.billed:>6} {share:>5.1f}%"
            f" {r.done:>4}/{r.documents:<5} {r.seconds:>7.1f} {r.seconds / ideal:>10.2f}"
            + (f"  ({'; '.join(r.notes)})" if r.notes else "")
        )
    by = {r.variant: r for r in results if not r.skipped}
    h = by.get("herd-limits")
    if h is not None:
        ok_429 = h.rate_limited <= 0.005 * max(1, h.calls)
        ok_time = h.seconds <= 1.10 * ideal
        print(
            f"\nherd-limits goals: 429s at most 0.5% of calls: {'met' if ok_429 else 'MISSED'};"
            f" within 10% of the ideal {ideal:.0f} s: {'met' if ok_time else 'MISSED'}"
        )


def write_summary(args: argparse.Namespace, results: list[Result]) -> None:
    by = {r.variant: r for r in results if not r.skipped}
    herd = by.get("herd-limits") or by.get("herd-nolimits")
    peer = by.get("celery-150") or by.get("celery-600")
    if args.summary is None or herd is None or peer is None:
        return
    rows = [
        _summary.row("429s received", herd.rate_limited, peer.rate_limited, "429s", "lower"),
        _summary.row("provider calls", herd.calls, peer.calls, "calls", "lower"),
        _summary.row("wall time", herd.seconds, peer.seconds, "s", "lower"),
    ]
    notes = [
        f"{args.docs} evaluations at {args.rpm} rpm / {args.tpm} tpm, {args.workers} workers x"
        f" {args.concurrency}; herd: {herd.variant}, Celery: {peer.variant}"
    ] + [
        f"{r.variant}: {r.rate_limited} 429s, {r.calls} calls, {r.seconds:.1f} s"
        for r in results
        if not r.skipped
    ]
    _summary.write(args.summary, "rate_limits", "Celery rate_limit", rows, notes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--docs", type=int, default=2000, help="evaluation requests")
    p.add_argument("--rpm", type=int, default=600, help="the simulator's requests per minute")
    p.add_argument("--tpm", type=int, default=200_000, help="the simulator's tokens per minute")
    p.add_argument("--latency", default="0.2:0.5", help="simulated seconds per call")
    p.add_argument("--workers", type=int, default=4, help="worker processes per variant")
    p.add_argument("--concurrency", type=int, default=16, help="calls in flight per worker")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    p.add_argument("--deadline", type=float, default=900.0, help="seconds per variant, at most")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="200 documents at 150 rpm: a smoke run")
    p.add_argument("--summary", type=Path, default=None, help="write the figures as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs)")
    args = p.parse_args(argv)
    if args.quick:
        args.docs, args.rpm, args.tpm = min(args.docs, 200), 150, 50_000
        args.deadline = min(args.deadline, 180.0)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS)
    if unknown or not variants:
        p.error(f"--variants takes {', '.join(VARIANTS)}; not {', '.join(sorted(unknown))}")
    tmp = Path(tempfile.mkdtemp(prefix="herd-bench-rl-"))
    try:
        (tmp / "logs").mkdir()
        docs = tmp / "docs"
        docs.mkdir()
        for i, text in enumerate(make_documents(args.docs, args.seed)):
            (docs / f"note-{i:05d}.txt").write_text(text, encoding="utf-8")
        (tmp / "prompt.txt").write_text(PROMPT, encoding="utf-8")
        (tmp / "schema.json").write_text(json.dumps(SCHEMA), encoding="utf-8")
        results = []
        for variant in variants:
            print(f"{variant}: starting (logs in {tmp / 'logs'})", file=sys.stderr, flush=True)
            run = run_herd if variant.startswith("herd") else run_celery
            result = run(args, variant, docs, tmp)
            if result.skipped:
                print(f"  {variant}: skipped: {result.skipped}", file=sys.stderr, flush=True)
            else:
                print(f"  {variant}: {result.seconds:.1f} s", file=sys.stderr, flush=True)
            results.append(result)
        print()
        report(results, args)
        write_summary(args, results)
        return 0 if all(r.skipped or r.done == r.documents for r in results) else 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
