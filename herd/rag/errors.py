"""Errors of the corpus index, shared by the catalogue (``herd.rag.store``) and the
vector stores (``herd.rag.vectors``), which both raise them."""

from __future__ import annotations

from herd.errors import HerdError


class IndexError_(HerdError):  # noqa: N801 - "IndexError" would shadow the builtin
    """The index is not in a state that allows this."""


class GenerationGone(IndexError_):
    """The generation was retired and its vectors dropped: resolve the live one again."""


def generation_gone(gen_id: int, collection: str) -> GenerationGone:
    return GenerationGone(f"generation {gen_id} of {collection!r} was swapped out and dropped")
