"""What an embedder is, what its ``id`` promises, and the helpers every kind shares.

An embedder turns texts into unit vectors of a fixed dimension. Its ``id`` is the
fingerprint source of an index generation: it names everything the vectors depend
on (model, the sha256 of the model file actually run, tokenizer, pooling,
normalization, maximum length, prefix), so two embedders with the same ``id`` give
the same vector for the same text, and any change that would move a vector changes
the ``id``.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from herd.errors import HerdError

Vectors = npt.NDArray[np.float32]
"""``(n, dim)`` float32, one row per text, in the order of the texts."""


class EmbedError(HerdError):
    """The texts could not be embedded."""


class ModelUnavailable(EmbedError):
    """The embedding model's files are not installed."""


@runtime_checkable
class Embedder(Protocol):
    """Texts in, unit vectors out.

    ``embed`` is synchronous and spends its time in native code that releases the
    GIL (ONNX Runtime, tokenizers, a socket), so ``asyncio.to_thread(e.embed, texts)``
    keeps an event loop responsive; ``aembed`` does that (or real async I/O) for you.
    """

    id: str
    dim: int

    def embed(self, texts: Sequence[str]) -> Vectors: ...

    async def aembed(self, texts: Sequence[str]) -> Vectors: ...


class ThreadedEmbedder:
    """``aembed`` for embedders whose work is CPU-bound native code: run it in a thread."""

    def embed(self, texts: Sequence[str]) -> Vectors:
        raise NotImplementedError

    async def aembed(self, texts: Sequence[str]) -> Vectors:
        return await asyncio.to_thread(self.embed, texts)


def make_id(kind: str, name: str, params: Mapping[str, object]) -> str:
    """``kind:name;key=value;…`` with sorted keys: stable, readable, and fit to hash."""
    for text in (kind, name, *params):
        if any(c in text for c in ";=\n"):
            raise ValueError(f"{text!r} may not contain ';', '=' or a line break")
    fields = ";".join(f"{k}={_plain(v)}" for k, v in sorted(params.items()))
    return f"{kind}:{name};{fields}" if fields else f"{kind}:{name}"


def _plain(value: object) -> str:
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return text.replace("%", "%25").replace(";", "%3B").replace("\n", "%0A")


def l2_normalize(vectors: npt.NDArray[np.floating]) -> Vectors:
    """Rows scaled to unit length; an all-zero row stays zero instead of becoming NaN."""
    rows: Vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    out: Vectors = np.zeros_like(rows)
    np.divide(rows, norms, out=out, where=norms > 0)
    return out


def empty(dim: int) -> Vectors:
    return np.zeros((0, dim), dtype=np.float32)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_texts(texts: Sequence[str]) -> list[str]:
    """The texts as a list, refusing a bare string (which is a sequence of characters)."""
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of texts, not one string: wrap it in a list")
    out = list(texts)
    for i, text in enumerate(out):
        if not isinstance(text, str):
            raise TypeError(f"text {i} is {type(text).__name__}, not str")
    return out


def embed_queries(embedder: Embedder, texts: Sequence[str]) -> Vectors:
    """Vectors for search queries: an embedder that prefixes queries apart from passages
    (e5's ``query: ``) has ``embed_queries``; for any other, queries embed as passages."""
    method = getattr(embedder, "embed_queries", None)
    vectors: Vectors = method(texts) if callable(method) else embedder.embed(texts)
    return vectors
