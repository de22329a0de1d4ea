"""``python -m chaos --backend postgres|redis|redis-cluster --workers 6 --jobs 2000 --minutes 5``;
``python -m chaos --partitions`` for network partitions (root; chaos/netns.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

from chaos.backends import BACKENDS
from chaos.harness import ChaosConfig, run_chaos


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    p.add_argument("--backend", choices=BACKENDS, default="postgres")
    p.add_argument("--workers", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=4, help="jobs in flight per worker")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--minutes", type=float, default=5.0, help="length of the fault phase")
    p.add_argument("--lease", type=float, default=3.0, help="lease seconds of the jobs")
    p.add_argument(
        "--faults-per-minute",
        default=None,
        help="how many faults of each kind per minute of the fault phase"
        " (default kill=4,stop=2,term=2,restart=1,drop=1)",
    )
    p.add_argument(
        "--eval-docs", type=int, default=120, help="evaluation documents (herd.eval; 0: none)"
    )
    p.add_argument(
        "--pipeline-docs",
        type=int,
        default=40,
        help="manuals evaluated in stages (split, map, reduce; 0: none)",
    )
    p.add_argument(
        "--partitions",
        action="store_true",
        help="the job store and the workers in network namespaces of their own, and"
        " network faults (default --faults-per-minute cut=1,oneway=1,slow=1,isolate=1)",
    )
    p.add_argument("--hosts", type=int, default=3, help="worker hosts of a partition run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--run-dir", type=Path, default=None, help="keep logs and records here")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    spec = args.faults_per_minute or (
        "cut=1,oneway=1,slow=1,isolate=1"
        if args.partitions
        else "kill=4,stop=2,term=2,restart=1,drop=1"
    )
    try:
        rates = {
            k: float(n) for k, _, n in (item.partition("=") for item in spec.split(",") if item)
        }
    except ValueError:
        p.error(f"--faults-per-minute {spec!r}: KIND=NUMBER,... (e.g. kill=4,stop=2)")
    if args.partitions and args.backend != "postgres":
        p.error("--partitions: the job store of a partition run is postgres (--backend postgres)")
    faults = {kind: max(1, round(n * args.minutes)) for kind, n in rates.items()}
    seconds = args.minutes * 60
    # Jobs long enough that the work lasts about as long as the fault phase.
    slots = args.workers * args.concurrency
    mean = max(0.2, min(5.0, seconds * slots / args.jobs - 0.3))
    config = ChaosConfig(
        backend=args.backend,
        workers=args.workers,
        concurrency=args.concurrency,
        jobs=args.jobs,
        lease=args.lease,
        fault_phase=seconds,
        faults=faults,
        job_seconds=(mean * 0.2, mean * 1.8),
        seed=args.seed,
        eval_docs=args.eval_docs,
        pipeline_docs=args.pipeline_docs,
        run_dir=args.run_dir,
        drain_timeout=max(120.0, seconds),
        network=args.partitions,
        hosts=args.hosts,
        fault_gap=2.0 if args.partitions else 0.0,  # one partition at a time
    )
    report = asyncio.run(run_chaos(config))
    if args.json:
        print(json.dumps({"backend": report.backend, "figures": report.figures,
                          "violations": report.violations}, indent=1, default=str))  # fmt: skip
    else:
        print(report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
