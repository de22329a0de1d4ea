"""Fair shares of one provider limit: a small batch submitted behind a big one.

Two batches on one provider, model and key under ``rpm 600`` (HERD_LIMITS): ``big``
(2,000 documents) at once, ``small`` (200) ``--delay`` seconds later (60), both of
weight 1, on the simulator with a realistic latency. The issue's goals:

* the small batch finishes within 10 % of the time it would take alone at half the
  rate (200 calls at half of the limit's steady 95 %: 42.1 s);
* the limit stays used: in every 10 s window while the big batch runs, the calls of
  both batches are at least 90 % of the limit (the big one's own share falls to half
  while the small one runs: that is the share, and it is printed too).

Times and windows are read from the cost ledger (the store's clock: each call's row
is opened just after its grant). In-process workers, embedded PostgreSQL under a
temporary HERD_HOME; the worker's concurrency is every document unless
``--concurrency`` says less (64 in bench/report.py): each batch's jobs carry the batch
as a concurrency key, so a worker with fewer slots than jobs claims the batches in turn
(docs/limits.md, "Fair shares") and the small batch's calls reach the limiter at once.

``--systems herd,celery`` runs, after herd, the same two batches on Celery, with a
simulator of its own and the same documents, requests and latency: Celery's workaround
for sharing one limit, a queue and a task per batch (bench/_celery_fair.py), each task
with a ``rate_limit`` of half the limit divided by the worker processes (Celery's limit
is per task name and per worker process): ``--celery-workers`` processes (1), each
``--pool threads --concurrency`` ``--celery-concurrency`` (16), on a Redis Stack server
as broker. Each answer is recorded in Redis with the time its call went out (the
windows) and the time it came back (the small batch's end). A static split leaves half
the limit unused whenever one batch runs alone; here Celery did worse than that, since
its rate-limited tasks came out of its worker at about one a second each on the Redis
transport, a tenth of their limit (10 calls in every 10 s window): what a user of
Celery's defaults gets, not the split's ceiling. The summary's first two rows hold herd
against the issue's goals; with Celery, more rows hold herd against Celery's figures.
Celery needs its own venv (``.[test,bench-celery]``, bench/README.md).

    python bench/fair_share.py [--big 2000] [--small 200] [--delay 60] [--rpm 600]
    python bench/fair_share.py --quick        # 400 and 40 documents, 30 s apart
    python bench/fair_share.py --systems herd,celery [--celery-workers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for _path in (str(REPO), str(REPO / "bench")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import _summary  # noqa: E402

from herd import App, Worker  # noqa: E402
from herd.builtin import tasks as builtin_tasks  # noqa: E402
from herd.embedded import embedded_server  # noqa: E402
from herd.errors import BrokerUnavailable  # noqa: E402
from herd.llm.eval import EvalRuntime, EvalSpec, enqueue_documents  # noqa: E402
from herd.llm.eval.spec import QUEUE  # noqa: E402
from herd.testing.simulator import SimulatorProcess  # noqa: E402

MODEL = "sim-fair"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["score"],
    "additionalProperties": False,
}
WINDOW = 10.0
STEADY = 0.95  # the GCRA's steady use of a limit (docs/limits.md)


def documents(n: int, tag: str) -> list[tuple[str, str]]:
    body = "The council surveyed the river and filed the budget of the station. " * 4
    return [(f"{tag}{i}.txt", f"Report {tag} {i}.\n{body}") for i in range(n)]


async def done_counts(rt: EvalRuntime) -> dict[str, int]:
    rows = await rt.store.execute(
        "SELECT batch, count(*) FILTER (WHERE status = 'done') FROM herd_eval_items GROUP BY batch",
        (),
    )
    return {b: int(n) for b, n in rows}


async def run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    app = App(database_url=url)
    app.include(builtin_tasks)
    spec = EvalSpec(model=MODEL, system="Rate the report from 1 to 5.", schema=SCHEMA,
                    params={"max_tokens": 20})  # fmt: skip
    async with app:
        rt = await EvalRuntime.of(app)
        every = args.big + args.small + 50
        worker = Worker(app, queues=[QUEUE], concurrency=args.concurrency or every,
                        poll_interval=0.05, install_signal_handlers=False)  # fmt: skip
        t0 = time.time()
        await enqueue_documents(app, spec, "big", documents(args.big, "b"))
        task = asyncio.create_task(worker.run())
        small_at: float | None = None
        small_end = big_end = None
        try:
            while big_end is None or small_end is None:
                await asyncio.sleep(0.25)
                now = time.time()
                if small_at is None and now - t0 >= args.delay:
                    small_at = time.time()
                    await enqueue_documents(app, spec, "small", documents(args.small, "s"),
                                            priority=args.small_priority)  # fmt: skip
                try:
                    counts = await done_counts(rt)
                except BrokerUnavailable:  # the pool is busy with 2,000 jobs starting
                    continue
                if small_end is None and counts.get("small", 0) >= args.small:
                    small_end = time.time()
                if big_end is None and counts.get("big", 0) >= args.big:
                    big_end = time.time()
                if now - t0 > args.timeout:
                    raise SystemExit(f"not finished within {args.timeout:g} s: {counts}")
        finally:
            worker.stop(immediate=True)
            await task
        rows = await rt.store.execute(
            "SELECT batch, extract(epoch FROM at)::float8 FROM herd_eval_ledger"
            " WHERE kind = 'call' ORDER BY at",
            (),
        )
    assert small_at is not None and small_end is not None and big_end is not None
    calls = [(b, float(at)) for b, at in rows]
    return {"t0": t0, "small_at": small_at, "small_end": small_end, "big_end": big_end,
            "calls": calls}  # fmt: skip


def celery_body(spec_system: str, max_tokens: int, text: str) -> dict[str, Any]:
    """The request herd's OpenAI provider sends for a document (herd.llm.providers.openai)."""
    return {
        "model": MODEL,
        "max_tokens": max_tokens,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "Score", "schema": SCHEMA, "strict": True},
        },
        "messages": [
            {"role": "system", "content": spec_system},
            {"role": "user", "content": text},
        ],
        "stream": False,
    }


def run_celery(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """The same two batches on Celery: a queue and a task per batch, each task with a
    ``rate_limit`` of half the limit over the worker processes (Celery's is per process)."""
    import json

    import redis
    from eval_cost import _tail, celery_fleet

    from bench import _celery_fair
    from herd.testing.fleet import worker_env
    from herd.testing.servers.redis_stack import RedisStackServer

    per_process = args.rpm / 2 / args.celery_workers
    rate = f"{per_process:g}/m"
    server = RedisStackServer(REPO / ".herd-test" / "cache", tmp / "redis", modules=())
    stack = contextlib.ExitStack()
    try:
        server.start()
        stack.callback(server.stop)
        sim = stack.enter_context(SimulatorProcess("--latency", args.latency, "--seed", "7",
                                                   log=tmp / "sim-celery.log"))  # fmt: skip
        r = stack.enter_context(redis.Redis.from_url(server.url))
        env = worker_env(pythonpath=[REPO], BENCH_CELERY_BROKER=server.url,
                         BENCH_SIM_URL=sim.url, BENCH_RATE_LIMIT=rate)  # fmt: skip
        queues = ",".join(_celery_fair.QUEUES.values())
        fleet = stack.enter_context(celery_fleet(
            "bench._celery_fair", queues, "threads", args.celery_concurrency, env,
            tmp / "logs", "celery-worker",
        ))  # fmt: skip
        fleet.start(args.celery_workers)
        app = _celery_fair.make_app(server.url)
        stack.callback(app.close)
        # The clock starts when every worker answers a ping: it consumes by then.
        deadline = time.monotonic() + 120
        while len(app.control.ping(timeout=1.0) or []) < args.celery_workers:
            for m in fleet.exited():
                raise RuntimeError(f"Celery worker exited {m.popen.returncode}:\n{_tail(m.log)}")
            if time.monotonic() > deadline:
                raise RuntimeError("the Celery workers did not answer a ping within 120 s")
        system = "Rate the report from 1 to 5."

        def submit(batch: str, docs: list[tuple[str, str]]) -> None:
            with app.producer_or_acquire() as producer:
                for name, text in docs:
                    body = celery_body(system, 20, text)
                    app.send_task(_celery_fair.TASKS[batch], args=(name, body),
                                  queue=_celery_fair.QUEUES[batch], producer=producer)  # fmt: skip

        t0 = time.time()
        submit("big", documents(args.big, "b"))
        small_at: float | None = None
        total = args.big + args.small
        while True:
            time.sleep(0.25)
            now = time.time()
            if small_at is None and now - t0 >= args.delay:
                small_at = time.time()
                submit("small", documents(args.small, "s"))
            if small_at is not None and int(r.hlen(_celery_fair.RESULTS)) >= total:
                break
            for m in fleet.exited():
                raise RuntimeError(f"Celery worker exited {m.popen.returncode}:\n{_tail(m.log)}")
            if now - t0 > args.timeout:
                got = int(r.hlen(_celery_fair.RESULTS))
                raise SystemExit(f"Celery: not finished within {args.timeout:g} s: {got}/{total}")
        rows = [json.loads(v) for v in r.hvals(_celery_fair.RESULTS)]
        fleet.stop(timeout=15)
    finally:
        stack.close()
    assert small_at is not None
    calls = sorted(((b, float(sent)) for b, sent, _ in rows), key=lambda c: c[1])
    small_end = max(float(ans) for b, _, ans in rows if b == "small")
    big_end = max(float(ans) for b, _, ans in rows if b == "big")
    return {"t0": t0, "small_at": small_at, "small_end": small_end, "big_end": big_end,
            "calls": calls, "rate": rate}  # fmt: skip


def windows(calls: list[tuple[str, float]], start: float, end: float) -> list[dict[str, Any]]:
    """Calls per batch in each WINDOW s from start, while before end."""
    out = []
    t = start
    while t + WINDOW <= end:
        got: dict[str, int] = {}
        for b, at in calls:
            if t <= at < t + WINDOW:
                got[b] = got.get(b, 0) + 1
        out.append({"at": t, **got})
        t += WINDOW
    return out


def figures(args: argparse.Namespace, got: dict[str, Any]) -> dict[str, Any]:
    calls = got["calls"]
    # The windows while the big batch is sure to have calls waiting: past the first burst,
    # before its last calls drain.
    first = min(at for _, at in calls)
    last_big = max(at for b, at in calls if b == "big")
    spans = windows(calls, first + WINDOW / 2, last_big - WINDOW / 2)
    per_window = args.rpm / 60.0 * WINDOW
    use = [(w.get("big", 0) + w.get("small", 0)) / per_window for w in spans]
    during = [w for w in spans if w.get("small")]
    small_share = sum(w.get("small", 0) for w in during) / max(
        1, sum(w.get("small", 0) + w.get("big", 0) for w in during)
    )
    return {
        "small_time": got["small_end"] - got["small_at"],
        "spans": spans,
        "min_use": min(use) if use else 0.0,
        "mean_use": sum(use) / max(1, len(use)),
        "small_share": small_share,
    }


def report(name: str, setup: str, args: argparse.Namespace, got: dict[str, Any],
           f: dict[str, Any], alone_half: float) -> None:  # fmt: skip
    small_time = f["small_time"]
    print(f"{name}: {setup}")
    print(
        f"  small batch: {small_time:.1f} s from submit to its last answer; alone at half"
        f" the rate {alone_half:.1f} s (ratio {small_time / alone_half:.2f}, goal <= 1.10)"
    )
    print(
        f"  use of the limit in {WINDOW:g} s windows while big runs: min {f['min_use']:.0%},"
        f" mean {f['mean_use']:.0%} (goal >= 90%)"
    )
    print(f"  small's part of the calls while it ran: {f['small_share']:.0%} (fair: 50%)")
    print(f"  big batch ended {got['big_end'] - got['t0']:.1f} s after it was submitted")
    print(f"  calls per {WINDOW:g} s (from the big batch's submit; small submitted at"
          f" {got['small_at'] - got['t0']:.1f} s):")  # fmt: skip
    for w in f["spans"]:
        at = w["at"] - got["t0"]
        print(f"    {at:>6.1f} s  big {w.get('big', 0):>4}  small {w.get('small', 0):>4}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--big", type=int, default=2000)
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--delay", type=float, default=60.0)
    parser.add_argument("--rpm", type=int, default=600)
    parser.add_argument("--latency", default="0.3:0.9")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--concurrency", type=int, default=0, help="the worker's; default: every document"
    )
    parser.add_argument("--small-priority", type=int, default=0, help="the small batch's")
    parser.add_argument("--systems", default="herd", help="comma-separated: herd, celery")
    parser.add_argument("--celery-workers", type=int, default=1, help="Celery worker processes")
    parser.add_argument("--celery-concurrency", type=int, default=16,
                        help="threads of each Celery worker")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="400 and 40 documents, 30 s apart")
    parser.add_argument("--summary", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.big, args.small, args.delay = 400, 40, 30.0
    systems = [x.strip() for x in args.systems.split(",") if x.strip()]
    if not systems or set(systems) - {"herd", "celery"}:
        parser.error("--systems takes herd, celery")
    started = time.monotonic()
    got: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="herd-fair-") as tmp_dir:
        tmp = Path(tmp_dir)
        (tmp / "logs").mkdir()
        if "herd" in systems:
            limits = tmp / "limits.toml"
            limits.write_text(f'[[limits]]\nprovider = "openai"\nmodel = "{MODEL}"\n'
                              f"rpm = {args.rpm}\n")  # fmt: skip
            server = embedded_server(tmp / "home")
            url = server.acquire()
            try:
                with SimulatorProcess("--latency", args.latency, "--seed", "7",
                                      log=tmp / "sim.log") as sim:  # fmt: skip
                    os.environ.update(
                        OPENAI_API_KEY="sk-bench", OPENAI_BASE_URL=sim.url + "/v1",
                        HERD_LIMITS=str(limits), HERD_LIMIT_MAX_WAIT="3600",
                        # Every job is claimed at once: their first queries need the room.
                        HERD_PG_POOL_SIZE=os.environ.get("HERD_PG_POOL_SIZE", "24"),
                    )  # fmt: skip
                    got["herd"] = asyncio.run(run(args, url))
            finally:
                server.release()
        if "celery" in systems:
            got["celery"] = run_celery(args, tmp)
    rate = args.rpm / 60.0
    alone_half = args.small / (rate * STEADY / 2)
    print(
        f"fair share: big {args.big} documents, small {args.small} submitted"
        f" {args.delay:g} s later, rpm {args.rpm}, simulator latency {args.latency} s"
    )
    f: dict[str, dict[str, Any]] = {}
    for name in systems:
        f[name] = figures(args, got[name])
        if name == "herd":
            setup = (f"one limit (HERD_LIMITS rpm {args.rpm}), both batches weight 1, small's"
                     f" priority {args.small_priority}, one worker process of concurrency"
                     f" {args.concurrency or 'every document'}")  # fmt: skip
        else:
            setup = (f"a queue and a task per batch, each rate_limit={got[name]['rate']!r} on"
                     f" {args.celery_workers} worker process(es) (--pool threads,"
                     f" --concurrency {args.celery_concurrency}): {args.rpm // 2} a minute per"
                     " batch in all")  # fmt: skip
        report(name, setup, args, got[name], f[name], alone_half)
    if "herd" not in f:
        return 0
    h = f["herd"]
    ok = h["small_time"] <= 1.1 * alone_half and h["min_use"] >= 0.9
    rows = [
        _summary.row("small batch's time / alone at half the rate", h["small_time"],
                     1.1 * alone_half, "s", "lower"),
        _summary.row("least use of the limit in a 10 s window", h["min_use"], 0.9,
                     "fraction", "higher"),
    ]  # fmt: skip
    notes = [
        f"big {args.big}, small {args.small} after {args.delay:g} s, rpm {args.rpm},"
        f" concurrency {args.concurrency or 'all'}, small's priority {args.small_priority};"
        f" small's part while it ran {h['small_share']:.0%}"
    ]
    peer = "the issue's goals (no peer)"
    c = f.get("celery")
    if c is not None:
        print(
            f"herd / Celery: small batch's time {h['small_time'] / c['small_time']:.2f},"
            f" mean use of the limit {h['mean_use'] / max(c['mean_use'], 1e-9):.2f}"
        )
        peer = "the issue's goals; Celery, a queue per batch at half the limit"
        rows += [
            _summary.row("small batch's time vs Celery", h["small_time"], c["small_time"],
                         "s", "lower"),
            _summary.row("least use of the limit in a 10 s window vs Celery", h["min_use"],
                         c["min_use"], "fraction", "higher"),
            _summary.row("mean use of the limit while big runs vs Celery", h["mean_use"],
                         c["mean_use"], "fraction", "higher"),
        ]  # fmt: skip
        notes.append(f"Celery: rate_limit={got['celery']['rate']!r} per task on"
                     f" {args.celery_workers} worker process(es); small's part while it ran"
                     f" {c['small_share']:.0%}")  # fmt: skip
    _summary.write(args.summary, "fair_share", peer, rows, notes=notes,
                   seconds=time.monotonic() - started)  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
