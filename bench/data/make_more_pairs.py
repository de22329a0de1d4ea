"""Build the MRPC and STS-B labelled sets for ``bench/semantic_defaults.py`` (README.md here).

    python bench/data/make_more_pairs.py mrpc PATH/TO/msr_paraphrase_test.txt
    python bench/data/make_more_pairs.py stsb PATH/TO/sts-test.csv

The labels are the corpora's own (MRPC's "quality"; STS-B's similarity score, read
through the cut-offs below); this script only samples pairs, with a fixed seed, and
names the kind of change a near miss makes by the rule ``make_sick_pairs.py`` uses.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_sick_pairs import kind  # noqa: E402

SEED = 18
PER_LABEL = 300
# STS-B scores 0-5: 5 "completely equivalent", 4 "mostly equivalent, unimportant
# details differ", 3 "roughly equivalent, important information differs or is missing",
# 2 "not equivalent, share some details", 1 "not equivalent, same topic".
STS_SAME = 4.6  # at least: an answer to one answers the other
STS_NEAR = (1.0, 3.0)  # related but another question: what a cache must not serve
HERE = Path(__file__).resolve().parent
OUT = {"mrpc": HERE / "semantic_pairs_mrpc.jsonl", "stsb": HERE / "semantic_pairs_stsb.jsonl"}


def mrpc(path: Path) -> list[dict[str, object]]:
    rows = []
    with path.open(encoding="utf-8-sig", newline="") as f:
        for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            if len(r) != 5 or r[0] not in ("0", "1"):
                continue  # the header
            label = "paraphrase" if r[0] == "1" else "near_miss"
            rows.append({"cached": r[3], "asked": r[4], "label": label,
                         "source": f"mrpc:{r[1]}-{r[2]}"})  # fmt: skip
    return rows


def stsb(path: Path) -> list[dict[str, object]]:
    rows = []
    with path.open(encoding="utf-8", newline="") as f:
        for r in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            score = float(r[4])  # genre, file, year, id, score, sentence 1, sentence 2[, sources]
            if score >= STS_SAME:
                label = "paraphrase"
            elif STS_NEAR[0] <= score <= STS_NEAR[1]:
                label = "near_miss"
            else:
                continue
            rows.append({"cached": r[5], "asked": r[6], "label": label,
                         "source": f"stsb:{r[1]}-{r[2]}-{r[3]}", "score": score})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", choices=sorted(OUT))
    parser.add_argument("path", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = (mrpc if args.corpus == "mrpc" else stsb)(args.path)
    # Pairs equal up to case and spacing say nothing about a threshold: dropped.
    rows = [r for r in rows if " ".join(str(r["cached"]).lower().split())
            != " ".join(str(r["asked"]).lower().split())]  # fmt: skip
    rng = random.Random(SEED)
    out = []
    for label in ("paraphrase", "near_miss"):
        pool = [r for r in rows if r["label"] == label]
        out += rng.sample(pool, min(PER_LABEL, len(pool)))
    for r in out:
        r["kind"] = kind(str(r["cached"]), str(r["asked"])) if r["label"] == "near_miss" else "same"
    rng.shuffle(out)
    dest = args.out or OUT[args.corpus]
    dest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out), "utf-8")
    print(f"{dest}: {len(out)} pairs", file=sys.stderr)


if __name__ == "__main__":
    main()
