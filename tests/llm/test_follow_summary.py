"""The one-line summary of a batch: what it says about money."""

from herd.llm.eval import BatchStatus
from herd.llm.follow import summary


def test_cut_short_calls_are_shown_as_a_bound_beside_what_was_billed() -> None:
    # 150 answers billed $0.001799; three calls cut off by a killed worker counted at
    # their worst case, $0.03 (seen acting out a kill): "spent $0.03" hid the bill.
    status = BatchStatus("b", documents=150, done=150, spent=0.031799, estimated=0.03)
    assert summary(status) == "150/150 answered, spent $0.001799 + up to $0.03 cut short"


def test_spend_without_cut_short_calls_is_one_figure() -> None:
    status = BatchStatus("b", documents=2, done=1, queued=1, spent=0.25, budget=1.0)
    assert summary(status) == "1/2 answered, 1 queued, spent $0.25 of $1.00"
