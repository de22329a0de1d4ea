"""Plan accuracy: the dollars (and minutes) `herd eval submit --plan` promises against
what the ledger records after the run, per mode, on the provider simulator.

Four modes, each on documents of its own (so no mode is answered by another's cache):
synchronous and Batch API, each with a short prompt and with a shared rubric (a system
prompt of ``--rubric-tokens``, past OpenAI's 1,024-token prompt-cache minimum, so the
provider's cache reads it on every call after the first). Per mode the plan is made
twice before anything runs: with herd's rule (no tokenizer registered: three ASCII
characters a token, the limiter's conservative estimate) and with the model's tokenizer
registered (``herd.limits.tokens.register_tokenizer``; for the simulator its own
count, four characters a token, herd.testing.simulator.content.estimate_tokens). Then
the batch runs (in-process worker, the simulator's Batch API ending its batches after
``--batch-latency`` seconds) and the ledger's sum of the batch's paid rows is compared.

The answer schema is a verdict (an integer score and a label): its bound, the plan's
output estimate, is about 2.5 x the simulator's answer, which on documents of a few
thousand tokens is a few per cent of the dollars. A schema with free text has no
useful bound: the plan then errs high by the output it cannot know (see docs/plan.md).

Prices: the simulator's model is priced as gpt-4.1-mini (USD per 1M: input 0.40,
cached input 0.10, output 1.60; the Batch API half). The synchronous modes run under
HERD_LIMITS ``rpm`` (``--rpm``, 600): their planned minutes are compared with the
wall time of the run.

    python bench/plan_accuracy.py [--docs 200] [--rubric-tokens 3000] [--rpm 600]

Run from the repository root; it starts the embedded PostgreSQL under a temporary
HERD_HOME and a simulator, both on 127.0.0.1, and stops them when it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import _summary  # noqa: E402

from herd import App, Worker  # noqa: E402
from herd.builtin import tasks as builtin_tasks  # noqa: E402
from herd.cache.keys import normalize_document  # noqa: E402
from herd.embedded import embedded_server  # noqa: E402
from herd.limits.tokens import register_tokenizer  # noqa: E402
from herd.llm.eval import EvalRuntime, EvalSpec, batch_status, enqueue_documents  # noqa: E402
from herd.llm.eval.plan import Plan, plan_items  # noqa: E402
from herd.llm.eval.spec import QUEUE  # noqa: E402
from herd.llm.eval.submit import enqueue_batch_documents  # noqa: E402
from herd.testing.simulator import SimulatorProcess  # noqa: E402
from herd.testing.simulator.content import estimate_tokens  # noqa: E402

MODEL = "sim-plan"
PRICES = {MODEL: {"input": 0.40, "cached_input": 0.10, "output": 1.60}}
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "clarity": {"type": "integer", "minimum": 1, "maximum": 5},
        "label": {"enum": ["good", "fair", "poor"]},
    },
    "required": ["clarity", "label"],
    "additionalProperties": False,
}
PROMPT = "You grade reports. Rate clarity from 1 to 5 and label it. Answer in JSON only."
WORDS = (
    "the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "as", "was", "with",
    "be", "by", "on", "not", "this", "are", "at", "from", "which", "ledger", "contract",
    "river", "harvest", "signal", "archive", "committee", "budget", "engine", "winter",
    "clause", "measure", "survey", "council", "border", "witness", "repair", "market",
)  # fmt: skip
MODES = (("sync", False, False), ("sync+rubric", False, True),
         ("batch", True, False), ("batch+rubric", True, True))  # fmt: skip


def rubric(tokens: int) -> str:
    rng = random.Random(tokens)
    lines = [PROMPT, "", "Rubric, apply every criterion:"]
    while sum(len(x) + 1 for x in lines) < 4 * tokens:
        lines.append(f"{len(lines) - 2}. " + " ".join(rng.choice(WORDS) for _ in range(16)) + ".")
    return "\n".join(lines)


def documents(n: int, seed: int, words: tuple[int, int]) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        size = rng.randint(*words)
        text = " ".join(rng.choice(WORDS) for _ in range(size))
        out.append((f"m{seed}-doc{i}.txt", normalize_document(f"# Report {seed}.{i}\n\n{text}")))
    return out


async def billed(app: App, batch: str) -> tuple[Decimal, int, int]:
    rt = await EvalRuntime.of(app)
    rows = await rt.store.execute(
        "SELECT coalesce(sum(cost), 0), coalesce(sum(input_tokens), 0),"
        " coalesce(sum(output_tokens), 0)"
        " FROM herd_eval_ledger WHERE batch = %s AND kind IN ('call','lost','failed','cut_short')",
        (batch,),
    )
    cost, i, o = rows[0]
    return Decimal(cost), int(i), int(o)


async def run_mode(app: App, name: str, spec: EvalSpec, docs: list[tuple[str, str]],
                   batch_api: bool) -> float:  # fmt: skip
    """Run the batch to its end; its wall time in seconds."""
    t0 = time.monotonic()
    if batch_api:
        await enqueue_batch_documents(app, spec, name, docs)
    else:
        await enqueue_documents(app, spec, name, docs)
    worker = Worker(app, queues=[QUEUE], concurrency=16, poll_interval=0.05,
                    install_signal_handlers=False)  # fmt: skip
    task = asyncio.create_task(worker.run())
    try:
        while True:
            status = await batch_status(app, name)
            if status.finished:
                return time.monotonic() - t0
            if task.done():
                raise RuntimeError(f"{name}: the worker stopped: {task.exception()!r}")
            await asyncio.sleep(0.5)
    finally:
        worker.stop(immediate=True)
        await task


def pct(planned: Decimal | None, actual: Decimal) -> str:
    if planned is None or not actual:
        return "n/a"
    return f"{float((planned - actual) / actual) * 100:+.1f}%"


async def main_async(args: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    app = App(database_url=url)
    app.include(builtin_tasks)
    rows: list[dict[str, Any]] = []
    async with app:
        specs = {
            name: (EvalSpec(model=MODEL, system=rubric(args.rubric_tokens) if shared else PROMPT,
                            schema=SCHEMA), batch_api)
            for name, batch_api, shared in MODES
        }  # fmt: skip
        docs = {name: documents(args.docs, i, (args.words_min, args.words_max))
                for i, (name, _, _) in enumerate(MODES)}  # fmt: skip
        # Before any tokenizer is registered: herd's rule.
        rule: dict[str, Plan] = {}
        for name, (spec, batch_api) in specs.items():
            rule[name] = await plan_items(app, spec, docs[name], batch_api=batch_api)
        register_tokenizer(MODEL, estimate_tokens)
        for name, (spec, batch_api) in specs.items():
            plan = await plan_items(app, spec, docs[name], batch_api=batch_api)
            wall = await run_mode(app, name, spec, docs[name], batch_api)
            cost, i, o = await billed(app, name)
            row = {
                "mode": name,
                "calls": plan.calls,
                "billed_usd": float(cost),
                "planned_usd": float(plan.usd or 0),
                "planned_usd_rule": float(rule[name].usd or 0),
                "error": pct(plan.usd, cost),
                "error_rule": pct(rule[name].usd, cost),
                "input_tokens": [plan.input_tokens, i],
                "output_tokens": [plan.output_tokens, o],
                "provider_cache_share": round(plan.cache_share, 3),
                "planned_min": None if plan.minutes is None else round(plan.minutes, 2),
                "wall_min": round(wall / 60, 2),
            }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--words-min", type=int, default=800)
    parser.add_argument("--words-max", type=int, default=2400)
    parser.add_argument("--rubric-tokens", type=int, default=3000)
    parser.add_argument("--rpm", type=int, default=600)
    parser.add_argument("--batch-latency", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="40 shorter documents a mode")
    parser.add_argument("--summary", type=Path, help="write the figures here (bench/_summary.py)")
    args = parser.parse_args(argv)
    if args.quick:
        args.docs, args.words_min, args.words_max = 40, 300, 900
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="herd-plan-") as tmp_dir:
        tmp = Path(tmp_dir)
        (tmp / "prices.json").write_text(json.dumps(PRICES))
        (tmp / "limits.toml").write_text(
            f'[[limits]]\nprovider = "openai"\nmodel = "{MODEL}"\nrpm = {args.rpm}\n'
        )
        server = embedded_server(tmp / "home")
        url = server.acquire()
        try:
            with SimulatorProcess("--latency", "0.05:0.15", "--batch-latency",
                                  str(args.batch_latency), log=tmp / "sim.log") as sim:  # fmt: skip
                os.environ.update(
                    HERD_PRICES=str(tmp / "prices.json"), HERD_LIMITS=str(tmp / "limits.toml"),
                    OPENAI_BASE_URL=sim.url + "/v1", OPENAI_API_KEY="sk-bench",
                )  # fmt: skip
                rows = asyncio.run(main_async(args, url))
        finally:
            server.release()
    print(f"plan accuracy, {args.docs} documents a mode, {MODEL} priced as gpt-4.1-mini")
    print(f"{'mode':<14}{'billed':>11}{'planned':>11}{'error':>8}{'rule':>11}{'error':>8}"
          f"{'cache':>7}{'plan min':>9}{'wall min':>9}")  # fmt: skip
    for r in rows:
        planned_min = "-" if r["planned_min"] is None else f"{r['planned_min']:.2f}"
        usd = [f"${r[k]:.4f}" for k in ("billed_usd", "planned_usd", "planned_usd_rule")]
        print(f"{r['mode']:<14}{usd[0]:>11}{usd[1]:>11}"
              f"{r['error']:>8}{usd[2]:>11}{r['error_rule']:>8}"
              f"{r['provider_cache_share']:>7.0%}{planned_min:>9}"
              f"{r['wall_min']:>9.2f}")  # fmt: skip
    worst = max(abs(float(r["error"].rstrip("%"))) for r in rows if r["error"] != "n/a")
    print(f"worst error with the tokenizer: {worst:.1f}% (goal: within 10%)")
    summary = []
    for r in rows:
        if r["error"] == "n/a":
            continue
        error = abs(float(r["error"].rstrip("%")))
        summary.append(_summary.row(f"planned vs billed dollars, {r['mode']}, |error| (goal)",
                                    error, 10.0, "%", "lower"))  # fmt: skip
    _summary.write(args.summary, "plan_accuracy", "the goal", summary,
                   [f"{args.docs} documents a mode, a tokenizer registered; without one the"
                    " limiter's rule errs high (the `rule` column of the script's output)"],
                   time.monotonic() - started)  # fmt: skip
    return 0 if worst <= 10 else 1


if __name__ == "__main__":
    sys.exit(main())
