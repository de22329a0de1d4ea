"""A reduce larger than its model's context, reduced in rounds: the answers it reads are
grouped, in document order, into batches that fit the room the context leaves after the
prompt and the answer; each batch is reduced by one call (cached by what it reads), then
the results are grouped again, until one call reads them all. Pure: what a round reads,
not how it runs (herd.llm.eval.stages runs it).

Round 1 reads the map's answers (``[{"piece": 0, "loc": …, "answer": …}, …]``, the same
input as a reduce that fits); a later round reads the answers of the round before,
``[{"part": 0, "pieces": [0, 11], "answer": …}, …]``: which map pieces each summed up.
"""

from __future__ import annotations

from herd.jsonvalue import JSON, canonical
from herd.limits.tokens import count_text, estimate_input, requested_max
from herd.llm.eval.spec import EvalSpec

# The share of the context kept for the answer when the params name no max_tokens.
ANSWER_SHARE = 4


def room(spec: EvalSpec, context: int) -> int:
    """Tokens of input a call of ``spec`` may read in a context of ``context`` tokens:
    what is left after its prompt and its answer (max_tokens, else a quarter)."""
    answer = requested_max(spec.params) or context // ANSWER_SHARE
    return context - answer - estimate_input(spec.provider, spec.model, spec.system, "")


def item_tokens(item: JSON, model: str) -> int:
    """Tokens an item adds to a round's input: its canonical JSON and its comma."""
    return count_text(canonical(item), model) + 1


def group_sizes(sizes: list[int], spec: EvalSpec, context: int) -> list[list[int]]:
    """The positions of items of ``sizes`` tokens each (item_tokens), in order, in
    consecutive batches that fit the room. A batch holds two items at least but the
    last (an item larger than the room is sent as it is): each round then at least
    halves the count, so the rounds end. What a plan counts a round by (herd.llm.eval
    .pipeplan), with sizes it estimates for answers not made yet."""
    limit = max(1, room(spec, context))
    batches: list[list[int]] = []
    batch: list[int] = []
    size = 1  # the list's brackets
    for i, n in enumerate(sizes):
        if len(batch) >= 2 and size + n > limit:
            batches.append(batch)
            batch, size = [], 1
        batch.append(i)
        size += n
    if batch:
        batches.append(batch)
    return batches


def group(items: list[JSON], spec: EvalSpec, context: int) -> list[list[JSON]]:
    """``items`` in order, in consecutive batches whose canonical JSON fits the room
    (group_sizes)."""
    sizes = [item_tokens(item, spec.model) for item in items]
    return [[items[i] for i in batch] for batch in group_sizes(sizes, spec, context)]


def span(batch: list[JSON]) -> list[int]:
    """The map pieces a batch reads, first and last."""
    firsts, lasts = [], []
    for item in batch:
        assert isinstance(item, dict)
        pieces = item.get("pieces")
        if isinstance(pieces, list):
            firsts.append(pieces[0])
            lasts.append(pieces[-1])
        else:
            firsts.append(item["piece"])
            lasts.append(item["piece"])
    return [min(firsts), max(lasts)]
