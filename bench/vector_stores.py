"""Dense query latency per vector store, side by side with pgvector (herd.rag.vectors).

Reads collections already ingested under ``HERD_HOME`` (one per store, e.g. with
``HERD_VECTOR_URL=... herd ingest kjv.txt --collection kjv-milvus``), embeds the
queries once (phrases cut from random verses plus paraphrases), then times
``RagStore.search`` (k=10: the store's top-k, then the chunks' texts from
PostgreSQL) one query at a time on each collection's live generation, after a
warm-up. Prints p50/p99 per store and each store's p50 as a ratio of pgvector's
(goal: no store above 2x), and how often each store's first hit is pgvector's.

    python bench/vector_stores.py --collections kjv-pgvector kjv-milvus kjv-qdrant-edge

Run it with the ``milvus`` and ``qdrant`` extras installed and in one process per
embedded store's file (Milvus Lite and qdrant-edge lock their folders).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from herd import App
from herd.rag.ingest import RagRuntime

PARAPHRASES = [
    "Who created the heaven and the earth?",
    "God so loved the world that he gave his only son",
    "The Lord is my shepherd, I shall not want",
    "Love is patient and kind",
    "Blessed are the poor in spirit",
    "Do not be afraid, for I am with you",
    "In the beginning was the Word",
    "Thou shalt not kill",
]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collections", nargs="+", required=True)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    async with App() as app:
        rt = await RagRuntime.of(app)
        gens = {}
        for name in args.collections:
            gen = await rt.store.live(name)
            if gen is None:
                raise SystemExit(f"collection {name!r} has no live generation: ingest it first")
            gens[name] = gen
        # pgvector first: the others' ratios are to its p50.
        gens = dict(sorted(gens.items(), key=lambda item: item[1].store != "pgvector"))
        first = next(iter(gens.values()))
        rows = await rt.store.fetch(
            "SELECT text FROM herd_chunks WHERE collection = %s ORDER BY chunk_id",
            (first.collection,),
        )
        rng = random.Random(7)
        phrases = [
            " ".join(t.split()[: max(4, len(t.split()) // 2)])
            for (t,) in rng.sample(rows, args.queries)
        ]
        texts = PARAPHRASES + phrases
        vectors = rt.embedder.embed(texts)
        tops: dict[str, list[str]] = {}
        print(f"{len(texts)} queries, k={args.k}, after 10 warm-up queries per store")
        print(f"{'store':<40} {'p50 ms':>8} {'p99 ms':>8} {'x pgvector p50':>15}")
        p50s = {}
        for name, gen in gens.items():
            for v in vectors[:10]:
                await rt.store.search(gen, v, args.k)
            times, top = [], []
            for v in vectors:
                start = time.perf_counter()
                hits = await rt.store.search(gen, v, args.k)
                times.append((time.perf_counter() - start) * 1000)
                top.append(hits[0].chunk_id if hits else "")
            tops[name] = top
            times.sort()
            p50s[name] = statistics.median(times)
            p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
            base = next((p50s[n] for n in gens if gens[n].store == "pgvector"), None)
            ratio = f"{p50s[name] / base:.2f}x" if base and name in p50s else "-"
            print(f"{name + ' (' + gen.store + ')':<40} {p50s[name]:8.2f} {p99:8.2f} {ratio:>15}")
        reference = next((n for n in gens if gens[n].store == "pgvector"), None)
        if reference:
            for name in gens:
                same = sum(a == b for a, b in zip(tops[name], tops[reference], strict=True))
                print(f"{name}: first hit equals pgvector's in {same}/{len(texts)} queries")
        hits = await rt.store.search(next(iter(gens.values())), vectors[0], 1)
        print(f"'{PARAPHRASES[0]}' -> {hits[0].chunk_id if hits else None}")


if __name__ == "__main__":
    asyncio.run(main())
