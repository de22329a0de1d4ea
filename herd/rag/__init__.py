"""Retrieval over large static canonical corpora; ``herd.rag.chunkers`` cuts them into units."""
