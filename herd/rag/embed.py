"""Embedders, at the path the ingest task imports; they live in ``herd.rag.embedders``."""

from __future__ import annotations

from herd.rag.embedders import (
    DEFAULT_MAX_LENGTH,
    Embedder,
    EmbedError,
    ModelUnavailable,
    OnnxEmbedder,
    OptimizeError,
    RemoteEmbedder,
    RemoteEmbedError,
    SentenceTransformerEmbedder,
    Vectors,
    default_embedder,
)

__all__ = [
    "DEFAULT_MAX_LENGTH",
    "EmbedError",
    "Embedder",
    "ModelUnavailable",
    "OnnxEmbedder",
    "OptimizeError",
    "RemoteEmbedError",
    "RemoteEmbedder",
    "SentenceTransformerEmbedder",
    "Vectors",
    "default_embedder",
]
