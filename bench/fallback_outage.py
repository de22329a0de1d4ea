"""Fallback under an outage: a batch whose model goes down mid-run, against the same
batch with no outage.

Two runs on fresh documents, each on its own simulator (same latency draws): ``calm``,
no outage; ``outage``, the model answers 529 (Anthropic's overloaded_error, on OpenAI's
wire here) for ``--down`` seconds from the moment a third of the documents are answered.
Both name a fallback (``anthropic:claude-fb`` on the same simulator) and a budget. The
issue's goal: the outage run's wall time at most 1.1 x the calm one's, 0 documents dead,
the spend within the budget; the figures printed are those, and which model answered.

In-process workers (``--concurrency``), the embedded PostgreSQL under a temporary
HERD_HOME, ``HERD_FALLBACK_COOLDOWN`` ``--cooldown`` seconds.

    python bench/fallback_outage.py [--docs 2000] [--down 60] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import _summary  # noqa: E402

from herd import App, Worker  # noqa: E402
from herd.builtin import tasks as builtin_tasks  # noqa: E402
from herd.embedded import embedded_server  # noqa: E402
from herd.llm.eval import EvalRuntime, EvalSpec, batch_status, enqueue_documents  # noqa: E402
from herd.llm.eval.spec import QUEUE  # noqa: E402
from herd.testing.simulator import SimulatorProcess  # noqa: E402

MODEL = "sim-main"
FALLBACKS = ["anthropic:claude-fb"]
PRICES = {MODEL: {"input": 0.40, "output": 1.60}, "claude-fb": {"input": 1.0, "output": 5.0}}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"score": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["score"],
    "additionalProperties": False,
}


def documents(n: int, tag: str) -> list[tuple[str, str]]:
    body = "The council surveyed the river and filed the budget of the station. " * 8
    return [(f"{tag}{i}.txt", f"Report {tag} {i}.\n{body}") for i in range(n)]


async def run(args: argparse.Namespace, url: str, sim_url: str, name: str) -> dict[str, Any]:
    app = App(database_url=url)
    app.include(builtin_tasks)
    spec = EvalSpec(model=MODEL, system=f"Rate the report from 1 to 5 ({name}).", schema=SCHEMA)
    docs = documents(args.docs, name)
    control = httpx.AsyncClient(base_url=sim_url, timeout=10)
    async with app, control:
        t0 = time.monotonic()
        await enqueue_documents(app, spec, name, docs, budget=args.budget, fallbacks=FALLBACKS)
        worker = Worker(app, queues=[QUEUE], concurrency=args.concurrency, poll_interval=0.05,
                        install_signal_handlers=False)  # fmt: skip
        task = asyncio.create_task(worker.run())
        down_at: float | None = None
        try:
            while True:
                status = await batch_status(app, name)
                if status.finished:
                    wall = time.monotonic() - t0
                    break
                if name == "outage" and down_at is None and status.done >= args.docs // 3:
                    await control.post("/_sim/config", json={"spells": [
                        {"model": MODEL, "status": 529, "for": args.down}]})  # fmt: skip
                    down_at = time.monotonic() - t0
                await asyncio.sleep(0.25)
        finally:
            worker.stop(immediate=True)
            await task
        rt = await EvalRuntime.of(app)
        models = await rt.store.execute(
            "SELECT model, count(*) FROM herd_eval_ledger WHERE batch = %s AND kind = 'call'"
            " GROUP BY model ORDER BY model",
            (name,),
        )
        stats = (await control.get("/_sim/stats")).json()
    return {
        "run": name,
        "wall_s": round(wall, 1),
        "down_at_s": None if down_at is None else round(down_at, 1),
        "done": status.done,
        "dead": status.dead,
        "spent": status.spent,
        "budget": args.budget,
        "calls_by_model": {m: n for m, n in models},
        "spell_errors": stats.get("spell_errors", {}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--down", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--latency", default="0.2:0.6")
    parser.add_argument("--cooldown", type=int, default=10)
    parser.add_argument("--budget", type=float, default=50.0)
    parser.add_argument("--quick", action="store_true", help="300 documents, down 15 s")
    parser.add_argument("--summary", type=Path, help="write the figures here (bench/_summary.py)")
    args = parser.parse_args(argv)
    if args.quick:
        args.docs, args.down = 300, 15.0
    started = time.monotonic()
    rows = []
    with tempfile.TemporaryDirectory(prefix="herd-fallback-") as tmp_dir:
        tmp = Path(tmp_dir)
        (tmp / "prices.json").write_text(json.dumps(PRICES))
        server = embedded_server(tmp / "home")
        url = server.acquire()
        try:
            for name in ("calm", "outage"):
                with SimulatorProcess("--latency", args.latency, "--seed", "7",
                                      log=tmp / f"sim-{name}.log") as sim:  # fmt: skip
                    os.environ.update(
                        HERD_PRICES=str(tmp / "prices.json"), OPENAI_API_KEY="sk-bench",
                        OPENAI_BASE_URL=sim.url + "/v1", ANTHROPIC_BASE_URL=sim.url,
                        ANTHROPIC_API_KEY="sk-ant-bench",
                        HERD_FALLBACK_COOLDOWN=str(args.cooldown),
                    )  # fmt: skip
                    row = asyncio.run(run(args, url, sim.url, name))
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
        finally:
            server.release()
    calm, outage = rows
    ratio = outage["wall_s"] / calm["wall_s"]
    print(f"fallback under an outage: {args.docs} documents, {MODEL} down {args.down:g} s"
          f" from a third of the way, concurrency {args.concurrency}")  # fmt: skip
    for r in rows:
        print(f"  {r['run']:<7} wall {r['wall_s']:>7.1f} s  done {r['done']}  dead {r['dead']}"
              f"  spent ${r['spent'] or 0:.4f} of ${r['budget']:g}"
              f"  calls {r['calls_by_model']}  529s {sum(r['spell_errors'].values())}")  # fmt: skip
    print(f"  wall time ratio {ratio:.2f} (goal <= 1.1), dead {outage['dead']} (goal 0)")
    ok = ratio <= 1.1 and outage["dead"] == 0 and (outage["spent"] or 0) <= args.budget
    _summary.write(
        args.summary, "fallback_outage", "the goals",
        [_summary.row("wall time, outage / calm run (goal)", ratio, 1.1, "ratio", "lower"),
         _summary.row("documents dead under the outage (goal)", outage["dead"], 0, "docs",
                      "lower"),
         _summary.row("spent under the outage / budget", outage["spent"] or 0, args.budget, "$",
                      "lower")],
        [f"{args.docs} documents, {MODEL} down {args.down:g} s from a third of the way;"
         f" calls by model {outage['calls_by_model']}"],
        time.monotonic() - started,
    )  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
