"""Evaluations in stages under faults: herd's pipeline (split, map, reduce) against
DocETL on the same documents and the same provider simulator, one run.

Documents: ``--docs`` (200) reference manuals of 20 to 200 pieces each (``--skew``:
most are short, a few long), made as chaos/pipeline.py makes its manuals: a title
piece and ``##`` sections, 30 % of sections drawn from a small pool that several
manuals carry word for word. The stages are the chaos run's (chaos/pipeline.py): split
by heading, a note per section (``sim-chaos-map``), one summary per manual over its
notes (``sim-chaos-reduce``). Each system gets a fresh simulator (same latency draws,
same seed); the simulator's count per model tells map calls from reduce calls.

* ``herd-kill``: 8 ``herd worker --queue eval`` processes, one SIGKILLed at random and
  replaced every ``--kill-every`` (5) s (herd.testing.fleet). Checked with the chaos
  checker's own definitions (chaos/checker.py guarantees 7 and 9): every document has
  exactly one final answer and one reduce, no key is paid twice, the ledger equals the
  simulator's bill but for calls cut short by kills (counted). A key paid twice by one
  job taken over after a kill (its attempt got the answer and died before storing it)
  is counted as such a call, and printed; any other key paid twice fails the run.
* ``herd-rerun``: on the same database and simulator, the same documents again with
  only the reduce prompt changed, no kills: exactly one call per document, no map call.
* ``herd``: a fresh database and simulator, no kills (the calls to hold against
  DocETL's without kills).
* ``docetl``, ``docetl-kill``: DocETL's runner (its own venv, ``--docetl-python``) on an
  equivalent YAML pipeline (split by the ``##`` delimiter, map, reduce by document)
  through litellm's OpenAI settings pointed at the simulator, ``max_threads`` = herd's
  workers x concurrency. Under kills its one process is SIGKILLed
  ``--docetl-kill-every`` s after each run's first call (default: workers x kill-every,
  the rate at which each of herd's processes is killed; a wall clock from the start
  would kill it before it calls anything on a loaded machine) and started again, as a
  user would, until its output file is written; what it re-pays is counted. DocETL
  keeps its LLM-call cache on disk (its default): a re-run reads what an earlier run
  stored.

Dollars are the simulator's billed tokens at gpt-5 list prices (bench/eval_cost.py's
PRICES and billed_dollars). Goals (issue 31): herd no more calls than DocETL without
kills; under kills at most 0.6x its dollars and 0.8x its wall time.

    python3 -m venv .venv-docetl && .venv-docetl/bin/pip install -e ".[test,bench-docetl]"
    .venv-docetl/bin/python bench/pipeline_cost.py          # about 35 minutes on 2 cores

``--quick`` (6 manuals, 4 workers) is a smoke run (about 6 minutes on 2 cores at load
18, mostly the start-ups of workers and DocETL); ``--summary
PATH`` writes the figures as JSON for ``bench/report.py``; ``--systems`` picks the
runs. Without a DocETL interpreter (none given, none found) the DocETL runs are
skipped and said so. Run from the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
import psycopg

REPO = Path(__file__).resolve().parent.parent
for p in (REPO, REPO / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import _summary  # noqa: E402
from eval_cost import (  # noqa: E402
    PRICES,
    SimulatorProcess,
    WorkerPool,
    billed_dollars,
    eval_fleet,
    herd_env,
    kill_all_children,
    killing,
    spawn,
)

from chaos import pipeline as chaos_pipeline  # noqa: E402
from chaos.checker import (  # noqa: E402
    Observed,
    Report,
    _check_ledger,
    _check_pipeline,
    _observe_pipeline,
)
from chaos.record import RunRecord  # noqa: E402

MAP_MODEL, REDUCE_MODEL = chaos_pipeline.MAP_MODEL, chaos_pipeline.REDUCE_MODEL
SPLIT_STAGE, MAP_STAGE, REDUCE_STAGE = (
    "sections",
    chaos_pipeline.MAP_STAGE,
    chaos_pipeline.REDUCE_STAGE,
)
CONTEXT = 128_000  # tokens of both models' context: a summary over 200 notes fits in one call
RERUN_PROMPT = "Summarise the manual from its notes in two sentences. Answer in JSON."
SYSTEMS = ("herd-kill", "herd-rerun", "herd", "docetl", "docetl-kill")
GOAL_DOLLARS, GOAL_WALL = 0.6, 0.8
BATCH = "bench-pipe"
DELIM = "\n\n## "  # where herd's split by heading (depth 2) cuts, for DocETL's split


# --------------------------------------------------------------------------- documents


def manuals(n: int, pieces: tuple[int, int], seed: int, skew: float) -> dict[str, str]:
    """``n`` manuals (name -> text) of ``pieces`` (low, high) pieces each: low + (high -
    low) x u ** skew for u uniform in [0, 1) (skew 1: uniform; 16: most near low, a few
    long; mean low + (high - low) / (skew + 1)); a title piece and sections, 30 % of
    them from a pool shared across manuals."""
    rng = random.Random(seed)
    pool = [chaos_pipeline._section(rng, f"Shared register {i}") for i in range(6)]
    lo, hi = pieces
    out = {}
    for d in range(n):
        k = lo + round((hi - lo) * rng.random() ** skew)
        parts = [f"# Manual {d}\n\nThe reference manual of device {d}."]
        for s in range(k - 1):
            shared = rng.random() < 0.3
            parts.append(
                rng.choice(pool) if shared else chaos_pipeline._section(rng, f"Register {d}.{s}")
            )
        out[f"manual-{d:03d}.md"] = "\n\n".join(parts) + "\n"
    return out


def stages(reduce_prompt: str | None = None) -> tuple[Any, Any]:
    """The chaos run's map and reduce stages (prompt, schema), the reduce prompt replaced
    when given."""
    pipe = chaos_pipeline.pipeline()
    by = {s.name: s for s in pipe.steps}
    m, r = by[MAP_STAGE], by[REDUCE_STAGE]
    return (m.prompt, m.schema_), (reduce_prompt or r.prompt, r.schema_)


def write_pipeline_toml(folder: Path, reduce_prompt: str | None = None) -> Path:
    """The chaos pipeline as a file for ``herd eval submit --pipeline``."""
    folder.mkdir(parents=True, exist_ok=True)
    (m_prompt, m_schema), (r_prompt, r_schema) = stages(reduce_prompt)
    (folder / "map.txt").write_text(m_prompt, encoding="utf-8")
    (folder / "reduce.txt").write_text(r_prompt, encoding="utf-8")
    (folder / "map.json").write_text(json.dumps(m_schema), encoding="utf-8")
    (folder / "reduce.json").write_text(json.dumps(r_schema), encoding="utf-8")
    path = folder / "pipeline.toml"
    path.write_text(
        f'name = "bench-manuals"\n\n[defaults]\nprovider = "openai"\n'
        f"params = {{ temperature = 0 }}\n\n[context]\n"
        f'"{MAP_MODEL}" = {CONTEXT}\n"{REDUCE_MODEL}" = {CONTEXT}\n\n'
        f'[[stages]]\nname = "{SPLIT_STAGE}"\nkind = "split"\nby = "headings"\ndepth = 2\n\n'
        f'[[stages]]\nname = "{MAP_STAGE}"\nkind = "map"\nmodel = "{MAP_MODEL}"\n'
        f'prompt_file = "map.txt"\nschema_file = "map.json"\n\n'
        f'[[stages]]\nname = "{REDUCE_STAGE}"\nkind = "reduce"\nmodel = "{REDUCE_MODEL}"\n'
        f'prompt_file = "reduce.txt"\nschema_file = "reduce.json"\n',
        encoding="utf-8",
    )
    return path


# --------------------------------------------------------------------------- outcomes


@dataclass
class Outcome:
    system: str
    seconds: float
    documents: int
    answered: int  # documents with a final answer
    sim: dict[str, Any]
    kills: int = 0
    restarts: int = 0  # DocETL: runs started after the first
    cpu: float = 0.0  # the machine's busy CPU-seconds while it ran (every process)
    checks: list[str] = field(default_factory=list)  # violations (herd) / problems
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def calls(self) -> int:
        return int(self.sim["calls"])

    def model_calls(self, model: str) -> int:
        return int(self.sim.get("by_model", {}).get(model, 0))

    @property
    def cut_short(self) -> int:
        return int(self.sim.get("disconnected", 0))

    @property
    def dollars(self) -> float:
        return billed_dollars(self.sim)


def busy() -> float:
    """CPU-seconds the machine has been busy (every process: the system's, its store,
    the simulator), from /proc/stat through psutil: what a run costs beside its time."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0)
                 - getattr(t, "guest_nice", 0.0))  # fmt: skip


def minus(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The simulator's counters of what happened between two reads."""
    out = dict(after)
    for k in ("calls", "disconnected", "billed", "cached_input_tokens", "cache_write_tokens"):
        out[k] = int(after.get(k, 0)) - int(before.get(k, 0))
    out["by_model"] = {
        m: n - before.get("by_model", {}).get(m, 0) for m, n in after.get("by_model", {}).items()
    }
    out["billed_tokens"] = {
        k: after["billed_tokens"][k] - before["billed_tokens"][k] for k in after["billed_tokens"]
    }
    out["by_status"] = {
        k: n - before.get("by_status", {}).get(k, 0) for k, n in after.get("by_status", {}).items()
    }
    return out


# --------------------------------------------------------------------------- herd


class _Store:
    """The chaos checker's view of a backend: ``sql().fetch`` on herd's database."""

    name = "postgres"

    def __init__(self, url: str) -> None:
        self.url = url

    def sql(self) -> _Store:
        return self

    def fetch(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url) as conn:
            return conn.execute(query, params).fetchall()


def check_herd(url: str, batch: str, documents: int, stats: dict[str, Any]) -> Report:
    """Guarantees 7 (ledger = bill) and 9 (one reduce per document, no key paid twice)
    of chaos/checker.py, on this run's database and simulator."""
    store = _Store(url)
    seen = Observed("postgres", {})
    _observe_pipeline(store, seen, batch)  # type: ignore[arg-type]
    # The ledger as chaos.checker.observe reads it for an evaluation batch.
    seen.ledger = dict(store.fetch("SELECT kind, n FROM herd_eval_ledger_totals"))
    seen.ledger_rows = dict(
        store.fetch("SELECT kind, count(*) FROM herd_eval_ledger WHERE state = 'closed' GROUP BY 1")
    )
    ((seen.ledger_open,),) = store.fetch(
        "SELECT count(*) FROM herd_eval_ledger WHERE state = 'open'"
    )
    seen.keys_called_by_jobs = dict(
        store.fetch(
            "SELECT key, count(DISTINCT job_id) FROM herd_eval_ledger WHERE kind = 'call'"
            " AND state = 'closed' GROUP BY key HAVING count(DISTINCT job_id) > 1"
        )
    )
    record = RunRecord(config={}, pipeline_batch=batch, pipeline_documents=documents)
    report = Report("postgres")
    sim = {"eval": {"stats": stats}}
    _check_ledger(seen, record, sim, report)
    _check_pipeline(seen, record, sim, report)
    report.figures["ledger_rows"] = dict(seen.ledger)
    return report


def lost_answers(url: str, batch: str) -> dict[str, int]:
    """The keys paid more than once (call or failed rows) whose every row comes from one
    job, taken over after a killed worker at least once per extra row: an attempt that
    got its answer, closed its ledger row, and died before the answer was stored. Key
    -> extra calls."""
    rows = _Store(url).fetch(
        "SELECT l.key, count(*), count(DISTINCT l.job_id), max(j.stalls)"
        " FROM herd_eval_ledger l JOIN herd_jobs j ON j.id = l.job_id"
        " WHERE l.batch = %s AND l.state = 'closed' AND l.kind IN ('call', 'failed')"
        " GROUP BY l.key HAVING count(*) > 1",
        (batch,),
    )
    return {str(k): int(n) - 1 for k, n, jobs, stalls in rows if jobs == 1 and n - 1 <= stalls}


def finals(url: str, batch: str) -> list[float]:
    """Seconds from the batch's creation to each manual's final answer, in order: a
    later stage runs ahead of the earlier stages' backlog (herd.llm.eval.stages), so the
    first manuals are answered while the maps of the others still run."""
    rows = _Store(url).fetch(
        "SELECT extract(epoch FROM i.finished_at - b.created_at) FROM herd_eval_items i"
        " JOIN herd_eval_batches b USING (batch)"
        " WHERE i.batch = %s AND i.status = 'done' ORDER BY i.finished_at",
        (batch,),
    )
    return [float(t) for (t,) in rows]


class HerdRun:
    """One database and simulator for herd: runs of batches on it, with or without kills."""

    def __init__(self, args: argparse.Namespace, tmp: Path, name: str) -> None:
        from herd.embedded import embedded_server

        self.args, self.tmp, self.name = args, tmp, name
        self.home = tmp / f"{name}-home"
        self.server = embedded_server(self.home)
        self.url = self.server.acquire()
        self.stack = contextlib.ExitStack()
        try:
            self.sim = self.stack.enter_context(
                SimulatorProcess(args.latency, args.seed, tmp / "logs" / f"sim-{name}.log")
            )
            prices = tmp / "prices.json"
            self.env = herd_env(self.home, self.url, self.sim, HERD_PRICES=str(prices))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.stack.close()
        kill_all_children()
        self.server.release()

    def status(self, batch: str) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "herd", "eval", "status", batch, "--json"],
            env=self.env, cwd=REPO, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"herd eval status failed: {out.stderr.decode()[-2000:]}")
        result: dict[str, Any] = json.loads(out.stdout)
        return result

    def run(self, batch: str, docs: Path, pipeline: Path, kill_every: float) -> Outcome:
        """Submit ``docs`` as ``batch`` in stages and wait for every document, SIGKILLing
        a worker every ``kill_every`` s (0: none)."""
        args = self.args
        before = self.sim.stats()
        fleet = eval_fleet(self.env, self.tmp / "logs", f"{self.name}-{batch}", args.concurrency)
        pool = WorkerPool(self.name, fleet, args.workers)
        n = len(list(docs.iterdir()))
        with fleet:
            pool.start()
            t0, cpu0 = time.monotonic(), busy()
            submit = spawn(
                [sys.executable, "-m", "herd", "eval", "submit", str(docs), "--pipeline",
                 str(pipeline), "--batch", batch, "--json"],
                self.env, self.tmp / "logs" / f"{self.name}-submit-{batch}.log",
            )  # fmt: skip
            deadline = t0 + args.deadline
            # Followed as a user follows it: one `herd eval wait`, which reads the batch's
            # status in its own process twice a second. A `herd eval status` process per
            # poll cost about 1.7 CPU-seconds each (the interpreter and herd's imports),
            # a third of the CPU herd was charged with on 2 cores.
            waiter: subprocess.Popen[bytes] | None = None
            wait_log = self.tmp / "logs" / f"{self.name}-wait-{batch}.log"
            label = self.name if batch == BATCH else "herd-rerun"
            with killing(pool, kill_every, args.seed + 1):
                while time.monotonic() < deadline:
                    pool.check()
                    if waiter is None and submit.poll() is not None:
                        if submit.returncode != 0:
                            raise RuntimeError(f"herd eval submit failed: see {self.tmp / 'logs'}")
                        waiter = spawn(
                            [sys.executable, "-m", "herd", "eval", "wait", batch],
                            self.env, wait_log,
                        )  # fmt: skip
                    if waiter is not None:
                        if waiter.poll() is not None:
                            break
                        progress(label, t0, last_line(wait_log), self.sim, pool)
                    time.sleep(0.2)
            seconds, cpu = time.monotonic() - t0, busy() - cpu0
            if waiter is not None and waiter.poll() is None:  # the deadline
                waiter.terminate()
                waiter.wait()
            pool.stop()
        stats = minus(self.sim.stats(), before)
        final = self.status(batch)
        return Outcome(
            f"{self.name}" if batch == BATCH else f"{self.name}-rerun",
            seconds,
            n,
            int(final["done"]),
            stats,
            kills=pool.kills,
            cpu=cpu,
            facts={"status": final, "deadline_hit": time.monotonic() >= deadline},
        )


def run_herd(
    args: argparse.Namespace, tmp: Path, docs: Path, kills: bool, rerun: bool
) -> list[Outcome]:
    name = "herd-kill" if kills else "herd"
    h = HerdRun(args, tmp, name)
    try:
        out = h.run(BATCH, docs, write_pipeline_toml(tmp / "pipe"), args.kill_every if kills else 0)
        report = check_herd(h.url, BATCH, out.documents, h.sim.stats())
        lost = lost_answers(h.url, BATCH)
        # Guarantee 9 counts every second 'call' row of a key; a job whose attempt got
        # its answer and was killed before storing it pays again on its next attempt:
        # a call cut short by a kill (as bench/eval_cost.py counts lost answers).
        out.checks = [v for v in report.violations if not any(f"key {k[:12]}" in v for k in lost)]
        out.facts["lost_answers"] = lost
        out.facts["figures"] = report.figures
        out.facts["finals"] = finals(h.url, BATCH)
        outcomes = [out]
        if rerun:
            again = h.run(f"{BATCH}-2", docs, write_pipeline_toml(tmp / "pipe2", RERUN_PROMPT), 0)
            again.system = "herd-rerun"
            m, r = again.model_calls(MAP_MODEL), again.model_calls(REDUCE_MODEL)
            if m != 0:
                again.checks.append(f"the re-run made {m} map calls (expected none)")
            if r != again.documents:
                again.checks.append(
                    f"the re-run made {r} reduce calls for {again.documents} documents"
                )
            if again.answered != again.documents:
                again.checks.append(f"the re-run answered {again.answered} of {again.documents}")
            outcomes.append(again)
        return outcomes
    finally:
        h.close()


_last = [0.0]


def last_line(log: Path) -> str:
    """The newest progress line `herd eval wait` wrote (every 10 s off a terminal)."""
    try:
        lines = log.read_bytes().decode(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return next((line for line in reversed(lines) if line.startswith("batch ")), "")


def progress(name: str, t0: float, line: str, sim: SimulatorProcess, pool: WorkerPool) -> None:
    now = time.monotonic()
    if now - _last[0] < 10:
        return
    _last[0] = now
    st = sim.stats()
    print(
        f"  {name} {now - t0:5.0f}s: {st['calls']} calls ({st['disconnected']} cut short),"
        f" {pool.kills} kills; {line.partition(': ')[2] or 'starting'}",
        file=sys.stderr,
        flush=True,
    )


# --------------------------------------------------------------------------- DocETL

# DocETL's split counts tokens with tiktoken, which fetches its encodings from the
# network on first use: the ones litellm ships (its tokenizers folder) serve offline.
DOCETL_RUNNER = r"""
import os, sys
import litellm.litellm_core_utils.tokenizers as shipped
os.environ.setdefault("TIKTOKEN_CACHE_DIR", os.path.dirname(shipped.__file__))
from docetl.runner import DSLRunner
runner = DSLRunner.from_yaml(sys.argv[1], max_threads=int(sys.argv[2]))
cost = runner.load_run_save()
print("docetl cost", cost, flush=True)
"""


def docetl_yaml(folder: Path, data: Path, output: Path, api_base: str) -> Path:
    """The same stages for DocETL: split on the ``##`` heading, a note per chunk, one
    summary per manual over its notes, in chunk order."""
    (m_prompt, m_schema), (r_prompt, r_schema) = stages()

    def schema(s: dict[str, Any]) -> dict[str, str]:
        return {k: "string" for k in s["properties"]}

    config = {
        "default_model": f"openai/{MAP_MODEL}",
        "default_lm_api_base": api_base,
        "system_prompt": {},
        "datasets": {"manuals": {"type": "file", "path": str(data)}},
        "operations": [
            {"name": SPLIT_STAGE, "type": "split", "split_key": "text", "method": "delimiter",
             "method_kwargs": {"delimiter": DELIM, "num_splits_to_group": 1}},
            {"name": MAP_STAGE, "type": "map", "model": f"openai/{MAP_MODEL}",
             "prompt": m_prompt + "\n\n{{ input.text_chunk }}",
             "output": {"schema": schema(m_schema), "mode": "structured_output"}},
            {"name": REDUCE_STAGE, "type": "reduce", "model": f"openai/{REDUCE_MODEL}",
             "reduce_key": "id",
             "prompt": r_prompt + "\n\n{% for item in inputs %}{{ item.note }}\n{% endfor %}",
             "output": {"schema": schema(r_schema), "mode": "structured_output"}},
        ],
        "pipeline": {
            "steps": [{"name": "manuals", "input": "manuals",
                       "operations": [SPLIT_STAGE, MAP_STAGE, REDUCE_STAGE]}],
            "output": {"type": "file", "path": str(output)},
        },
    }  # fmt: skip
    path = folder / "pipeline.yaml"
    path.write_text(json.dumps(config, indent=1), encoding="utf-8")  # JSON is YAML
    return path


def find_docetl(given: str | None) -> str | None:
    """The interpreter that has docetl: ``--docetl-python``, else this one if it has it."""
    candidates = [given] if given else [sys.executable]
    for py in candidates:
        if py and Path(py).exists():
            ok = subprocess.run([py, "-c", "import docetl"], capture_output=True, check=False)
            if ok.returncode == 0:
                return py
    return None


def docetl_version(py: str) -> str:
    out = subprocess.run(
        [py, "-c", "import importlib.metadata as m;"
         " print(m.version('docetl'), m.version('litellm'))"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip() or "?"


def run_docetl(
    args: argparse.Namespace, tmp: Path, texts: dict[str, str], py: str, kills: bool
) -> Outcome:
    """``docetl run`` to its end, SIGKILLed every ``--docetl-kill-every`` s and started
    again until its output exists (``kills``), against a simulator of its own."""
    name = "docetl-kill" if kills else "docetl"
    folder = tmp / name
    folder.mkdir()
    data, output = folder / "manuals.json", folder / "out.json"
    rows = [{"id": k, "text": v} for k, v in texts.items()]
    data.write_text(json.dumps(rows), encoding="utf-8")
    (folder / "runner.py").write_text(DOCETL_RUNNER, encoding="utf-8")
    with SimulatorProcess(args.latency, args.seed, tmp / "logs" / f"sim-{name}.log") as sim:
        yaml = docetl_yaml(folder, data, output, sim.url + "/v1")
        threads = str(args.workers * args.concurrency)
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        env.update({
            "OPENAI_API_KEY": "sk-bench",
            "OPENAI_API_BASE": sim.url + "/v1",
            "OPENAI_BASE_URL": sim.url + "/v1",
            "HOME": str(folder / "home"),  # its LLM-call cache, this run's alone
            "DOCETL_HOME_DIR": str(folder / "home"),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        })  # fmt: skip
        every = args.docetl_kill_every if kills else 0.0
        t0, cpu0 = time.monotonic(), busy()
        deadline = t0 + args.deadline
        runs = kills_n = 0
        while not output.exists() and time.monotonic() < deadline:
            runs += 1
            proc = spawn(
                [py, str(folder / "runner.py"), str(yaml), threads], env,
                tmp / "logs" / f"{name}-run-{runs}.log",
            )  # fmt: skip
            # The kill clock starts at the run's first call: DocETL's start (imports,
            # loading, splitting) takes tens of seconds on a loaded machine, and a run
            # killed before it calls anything would never get anywhere.
            calls0, end = sim.stats()["calls"], deadline
            while proc.poll() is None and time.monotonic() < min(end, deadline):
                time.sleep(0.5)
                if every and end == deadline and sim.stats()["calls"] > calls0:
                    end = time.monotonic() + every
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                kills_n += 1
            elif proc.returncode != 0:
                log = tmp / "logs" / f"{name}-run-{runs}.log"
                raise RuntimeError(f"docetl exited {proc.returncode}: see {log}")
            progress_docetl(name, t0, sim, runs)
        seconds, cpu = time.monotonic() - t0, busy() - cpu0
        stats = sim.stats()
    answered = 0
    if output.exists():
        out = json.loads(output.read_text(encoding="utf-8"))
        answered = len({r["id"] for r in out if r.get(REDUCE_STAGE_FIELD)})
    return Outcome(name, seconds, len(texts), answered, stats, kills=kills_n,
                   restarts=runs - 1, cpu=cpu,
                   facts={"deadline_hit": not output.exists()})  # fmt: skip


REDUCE_STAGE_FIELD = "summary"


def progress_docetl(name: str, t0: float, sim: SimulatorProcess, runs: int) -> None:
    st = sim.stats()
    print(
        f"  {name} {time.monotonic() - t0:5.0f}s: run {runs} ended, {st['calls']} calls"
        f" ({st['disconnected']} cut short)",
        file=sys.stderr,
        flush=True,
    )


# --------------------------------------------------------------------------- report


def report(
    outcomes: list[Outcome], args: argparse.Namespace, pieces: int, unique_maps: int
) -> list[str]:
    """Print the table and the checks; returns what failed."""
    failed: list[str] = []
    print(
        f"{args.docs} manuals, {pieces} pieces ({unique_maps} distinct sections), latency"
        f" {args.latency} s; herd {args.workers} workers x {args.concurrency}, a SIGKILL every"
        f" {args.kill_every:g} s; DocETL {args.workers * args.concurrency} threads, killed every"
        f" {args.docetl_kill_every:g} s under kills\n"
    )
    head = (
        f"{'':12} {'seconds':>7} {'answered':>9} {'calls':>6} {'map':>6} {'reduce':>6}"
        f" {'cut':>4} {'kills':>5} {'dollars':>8} {'cpu s':>6} {'ms/call':>7}"
    )
    print(head)
    print("-" * len(head))
    for o in outcomes:
        print(
            f"{o.system:12} {o.seconds:7.1f} {o.answered:>4}/{o.documents:<4} {o.calls:>6}"
            f" {o.model_calls(MAP_MODEL):>6} {o.model_calls(REDUCE_MODEL):>6} {o.cut_short:>4}"
            f" {o.kills:>5} {o.dollars:8.4f} {o.cpu:6.1f} {1000 * o.cpu / max(1, o.calls):7.1f}"
        )
    print(
        "\ncut: calls whose client hung up (a kill mid-call); dollars: the simulator's bill;"
        " cpu s: the machine's busy CPU-seconds over the run (every process), ms/call: per"
        " provider call"
    )
    for o in outcomes:
        t = o.facts.get("finals")
        if t:
            print(
                f"{o.system}: manuals' final answers from the submission: first {t[0]:.1f} s,"
                f" 10th {t[min(9, len(t) - 1)]:.1f} s, median {statistics.median(t):.1f} s,"
                f" last {t[-1]:.1f} s"
            )
    for o in outcomes:
        if o.answered != o.documents:
            failed.append(f"{o.system}: {o.answered} of {o.documents} documents answered")
        if o.facts.get("deadline_hit"):
            failed.append(f"{o.system}: deadline hit")
        for v in o.checks:
            failed.append(f"{o.system}: {v}")
        fig = o.facts.get("figures")
        if fig:
            print(f"\n{o.system} (chaos checker, guarantees 7 and 9):")
            for k in ("pipeline_documents", "pipeline_reduce_calls",
                      "pipeline_keys_paid_twice", "eval_ledger_equals_bill",
                      "eval_calls_hit_by_faults", "eval_ledger"):  # fmt: skip
                if k in fig:
                    print(f"  {k.replace('_', ' ')}: {fig[k]}")
            led = fig.get("ledger_rows", {})
            extra = o.calls - int(led.get("call", 0))
            cut = int(led.get("cut_short", 0)) + int(led.get("lost", 0))
            lost = o.facts.get("lost_answers", {})
            print(
                f"  calls beyond one per key paid: {extra}; calls cut short by kills (ledger):"
                f" {cut}, of which the simulator saw {o.cut_short} hang up"
            )
            if lost:
                print(
                    f"  keys paid twice (guarantee 9): {len(lost)}, each by one job whose"
                    f" attempt got its answer and was SIGKILLed before storing it"
                    f" ({sum(lost.values())} calls, counted as cut short by kills)"
                )
            print(f"  {'no violation' if not o.checks else 'VIOLATIONS: ' + '; '.join(o.checks)}")
        if o.system == "herd-rerun":
            print(
                f"\nherd-rerun (reduce prompt changed): {o.model_calls(REDUCE_MODEL)} reduce calls"
                f" for {o.documents} documents, {o.model_calls(MAP_MODEL)} map calls"
                f" ({'goal met' if not o.checks else 'GOAL MISSED'})"
            )
        if o.restarts:
            print(f"{o.system}: started {o.restarts + 1} times ({o.kills} SIGKILLs)")
    by = {o.system: o for o in outcomes}
    for h, d in (("herd", "docetl"), ("herd-kill", "docetl-kill")):
        if h in by and d in by:
            a, b = by[h], by[d]
            print(
                f"\n{h} / {d}: calls {a.calls}/{b.calls} = {a.calls / max(1, b.calls):.3f}x,"
                f" dollars {a.dollars / max(1e-12, b.dollars):.3f}x,"
                f" wall time {a.seconds / max(1e-9, b.seconds):.3f}x"
            )
    if "herd" in by and "docetl" in by:
        ok = by["herd"].calls <= by["docetl"].calls
        print(f"goal: herd no more calls than DocETL without kills: {'met' if ok else 'MISSED'}")
    if "herd-kill" in by and "docetl-kill" in by:
        a, b = by["herd-kill"], by["docetl-kill"]
        rd, rw = a.dollars / max(1e-12, b.dollars), a.seconds / max(1e-9, b.seconds)
        print(
            f"goal under kills: dollars {rd:.3f}x (<= {GOAL_DOLLARS}:"
            f" {'met' if rd <= GOAL_DOLLARS else 'MISSED'}), wall time {rw:.3f}x"
            f" (<= {GOAL_WALL}: {'met' if rw <= GOAL_WALL else 'MISSED'})"
        )
    return failed


def write_summary(
    args: argparse.Namespace, outcomes: list[Outcome], pieces: int, seconds: float, version: str
) -> None:
    by = {o.system: o for o in outcomes}
    rows = []
    for h, d, label in (
        ("herd", "docetl", "no kills"),
        ("herd-kill", "docetl-kill", "under kills"),
    ):
        if h in by and d in by:
            a, b = by[h], by[d]
            rows += [
                _summary.row(f"provider calls, {label}", a.calls, b.calls, "calls", "lower"),
                _summary.row(f"dollars billed, {label}", a.dollars, b.dollars, "USD", "lower"),
                _summary.row(f"wall time, {label}", a.seconds, b.seconds, "s", "lower"),
                _summary.row(f"machine CPU, {label}", a.cpu, b.cpu, "CPU-s", "lower"),
            ]
    notes = [
        f"{args.docs} manuals, {pieces} pieces, split/map/reduce; herd {args.workers} workers"
        f" x {args.concurrency}, a SIGKILL every {args.kill_every:g} s; DocETL {version},"
        f" {args.workers * args.concurrency} threads, killed every {args.docetl_kill_every:g} s"
    ]
    if "herd-kill" in by:
        k = by["herd-kill"]
        notes.append(
            f"herd under kills: {k.answered}/{k.documents} answered, {k.cut_short} calls hung"
            f" up by kills, {sum(k.facts.get('lost_answers', {}).values())} answered calls"
            " re-paid after a kill lost the answer before it was stored,"
            f" {'no violation' if not k.checks else 'VIOLATIONS: ' + '; '.join(k.checks)}"
        )
    if "herd-rerun" in by:
        r = by["herd-rerun"]
        notes.append(
            f"re-run with the reduce prompt changed: {r.model_calls(REDUCE_MODEL)} reduce calls for"
            f" {r.documents} documents, {r.model_calls(MAP_MODEL)} map calls"
        )
    if not rows:
        notes.append("DocETL not run: no interpreter with docetl (--docetl-python)")
    _summary.write(args.summary, "pipeline_cost", "DocETL", rows, notes, seconds)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--docs", type=int, default=200, help="manuals")
    p.add_argument("--pieces", default="20:200", help="pieces per manual, LOW:HIGH (see --skew)")
    p.add_argument(
        "--skew", type=float, default=16.0,
        help="pieces drawn as LOW + (HIGH - LOW) x u ** SKEW: 1 uniform, 16 mostly short",
    )  # fmt: skip
    p.add_argument("--workers", type=int, default=8, help="herd worker processes")
    p.add_argument("--concurrency", type=int, default=8, help="jobs in flight per herd worker")
    p.add_argument("--latency", default="0.3:0.9", help="simulated seconds per call, LOW:HIGH")
    p.add_argument("--kill-every", type=float, default=5.0, help="seconds between herd SIGKILLs")
    p.add_argument(
        "--docetl-kill-every", type=float, default=None,
        help="seconds from a DocETL run's first call to its SIGKILL (none: workers x --kill-every)",
    )  # fmt: skip
    p.add_argument("--docetl-python", default=None, help="an interpreter with docetl installed")
    p.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"comma-separated: {', '.join(SYSTEMS)}"
    )
    p.add_argument("--deadline", type=float, default=1800.0, help="seconds per run, at most")
    p.add_argument("--seed", type=int, default=31, help="of the documents, latencies and kills")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (logs)")
    p.add_argument(
        "--quick", action="store_true", help="6 manuals of 20-24 pieces, 4 workers: a smoke run"
    )
    p.add_argument("--summary", type=Path, default=None, help="write the figures as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.docs, args.workers, args.pieces = min(args.docs, 6), min(args.workers, 4), "20:24"
        args.deadline = min(args.deadline, 300.0)
    if args.docetl_kill_every is None:
        args.docetl_kill_every = args.workers * args.kill_every
    lo, _, hi = args.pieces.partition(":")
    pieces_range = (int(lo), int(hi or lo))
    if not 2 <= pieces_range[0] <= pieces_range[1]:
        p.error("--pieces: LOW:HIGH with 2 <= LOW <= HIGH")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if not systems or not set(systems) <= set(SYSTEMS):
        p.error(f"--systems takes a comma-separated list of {', '.join(SYSTEMS)}")
    if "herd-rerun" in systems and "herd-kill" not in systems:
        p.error("--systems: herd-rerun runs on herd-kill's database: give both")

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    tmp = Path(tempfile.mkdtemp(prefix="herd-bench-pipe-"))
    started = time.monotonic()
    try:
        (tmp / "logs").mkdir()
        texts = manuals(args.docs, pieces_range, args.seed, args.skew)
        docs = tmp / "docs"
        docs.mkdir()
        for name, text in texts.items():
            (docs / name).write_text(text, encoding="utf-8")
        (tmp / "prices.json").write_text(
            json.dumps({MAP_MODEL: PRICES, REDUCE_MODEL: PRICES}), encoding="utf-8"
        )
        chunks = [c for t in texts.values() for c in t.split(DELIM)]
        pieces, unique_maps = len(chunks), len(set(chunks))
        py = find_docetl(args.docetl_python)
        version = docetl_version(py) if py else "not installed"
        print(
            f"{args.docs} manuals, {pieces} pieces; systems {', '.join(systems)}; DocETL:"
            f" {py or 'none'} ({version}); files and logs in {tmp}",
            file=sys.stderr,
            flush=True,
        )
        outcomes: list[Outcome] = []
        done = 0
        for system in systems:
            _last[0] = 0.0
            if system == "herd-kill":
                outcomes += run_herd(args, tmp, docs, True, "herd-rerun" in systems)
            elif system == "herd":
                outcomes += run_herd(args, tmp, docs, False, False)
            elif system == "herd-rerun":
                continue  # with herd-kill, on its database
            elif system.startswith("docetl"):
                if py is None:
                    print(f"  {system}: skipped, no interpreter with docetl", file=sys.stderr)
                    continue
                outcomes.append(run_docetl(args, tmp, texts, py, system == "docetl-kill"))
            else:
                continue
            for o in outcomes[done:]:  # as each ends: a run cut off still leaves these
                print(
                    f"  {o.system}: {o.seconds:.1f}s, {o.answered}/{o.documents} answered,"
                    f" {o.calls} calls ({o.model_calls(MAP_MODEL)} map,"
                    f" {o.model_calls(REDUCE_MODEL)} reduce, {o.cut_short} cut short),"
                    f" ${o.dollars:.4f}, {o.kills} kills; {'; '.join(o.checks) or 'no violation'}",
                    file=sys.stderr,
                    flush=True,
                )
            done = len(outcomes)
        print()
        failed = report(outcomes, args, pieces, unique_maps)
        write_summary(args, outcomes, pieces, time.monotonic() - started, version)
        for line in failed:
            print(f"FAILED: {line}", file=sys.stderr)
        print(f"\ntotal {time.monotonic() - started:.0f}s", file=sys.stderr)
        return 1 if failed else 0
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
