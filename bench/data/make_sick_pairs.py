"""Build ``semantic_pairs_sick.jsonl`` from the SICK corpus (see README.md here).

    python bench/data/make_sick_pairs.py PATH/TO/SICK.txt
    python bench/data/make_sick_pairs.py SICK.txt --seed 7 \
        --exclude bench/data/semantic_pairs_sick.jsonl --out /tmp/heldout.jsonl  # held out

The labels are SICK's own; this script only selects pairs and names the kind of
change a near miss makes (by which words differ), with a fixed seed.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import re
from pathlib import Path

SEED = 18
PARAPHRASES = 300
NEAR_MISSES_PER_KIND = 130  # negations and substitutions; the rarer kinds are taken whole
NEAR = 3.5  # least SICK relatedness (1-5) of a near miss: close in meaning, not unrelated

NEGATION = {"not", "no", "nobody", "nothing", "none", "never", "n't", "nowhere", "without"}
NUMBER = {"one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"}
NUMBER |= {"eleven", "twelve", "single", "couple"}
SCOPE = {"all", "some", "every", "each", "many", "few", "several", "most", "both", "any"}
SCOPE |= {"only", "lots"}
OUT = Path(__file__).resolve().parent / "semantic_pairs_sick.jsonl"


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower().replace("n't", " n't"))


def kind(a: str, b: str) -> str:
    """What a contradiction changes, from the words that differ (first rule that applies)."""
    wa, wb = words(a), words(b)
    differ = set(wa) ^ set(wb)
    if differ & NEGATION:
        return "negation"
    if sorted(wa) == sorted(wb):
        return "swap"  # the same words in another order: who did what to whom
    if differ & NUMBER or any(w.isdigit() for w in differ):
        return "number"
    if differ & SCOPE:
        return "scope"
    return "substitution"  # another action, object or attribute (antonyms mostly)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sick", type=Path)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--exclude", type=Path, help="a pairs file whose pairs to leave out")
    args = parser.parse_args()
    with args.sick.open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    taken = set()
    if args.exclude:
        lines = args.exclude.read_text(encoding="utf-8").splitlines()
        taken = {json.loads(line)["source"] for line in lines}
    rows = [r for r in rows if f"sick:{r['pair_ID']}" not in taken]
    rng = random.Random(args.seed)
    share, near = [], {}
    for r in rows:
        a, b = r["sentence_A"].strip(), r["sentence_B"].strip()
        if " ".join(words(a)) == " ".join(words(b)):
            continue
        ab, ba, rel = r["entailment_AB"], r["entailment_BA"], float(r["relatedness_score"])
        pair = {"cached": a, "asked": b, "source": f"sick:{r['pair_ID']}", "relatedness": rel}
        if ab == "A_entails_B" and ba == "B_entails_A":
            share.append({**pair, "label": "paraphrase", "kind": "mutual_entailment"})
        elif ("contradicts" in ab or "contradicts" in ba) and rel >= NEAR:
            k = kind(a, b)
            near.setdefault(k, []).append({**pair, "label": "near_miss", "kind": k})
    chosen = rng.sample(share, PARAPHRASES)
    for k in sorted(near):
        pool = near[k]
        many = len(pool) > NEAR_MISSES_PER_KIND
        chosen += rng.sample(pool, NEAR_MISSES_PER_KIND) if many else pool
    rng.shuffle(chosen)
    with args.out.open("w", encoding="utf-8") as f:
        for pair in chosen:
            f.write(json.dumps(pair, ensure_ascii=False) + "\n")
    print(f"{len(chosen)} pairs -> {args.out}")


if __name__ == "__main__":
    main()
