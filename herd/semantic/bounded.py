"""The bounded mode: serve a neighbour only while the chance that its answer is wrong
stays under a bound the user sets (δ, ``error_bound``).

In the spirit of vCache (Schroeder et al., "vCache: Verified Semantic Prompt
Caching", ICLR 2026): a fixed similarity threshold is right for some entries and
wrong for others, so each entry learns its own from verdicts on the hits it
served or could have served. A verdict comes from the caller (``areport``), or
from the cache itself: a lookup through ``aget_or_compute`` that did not serve
its nearest candidate computes anyway, so comparing the fresh answer with the
candidate's costs nothing; and a sampled share of served hits (``recheck``) is
computed again to keep checking what is served.

The estimate, for a candidate at similarity ``s``:

- The pool: verdicts of every entry of the cache, counted by whether the near-miss
  guards agreed and by similarity bin (0.01 wide). The wrong (W) and right (R)
  verdicts from similarity ``s`` to ``s + 0.05`` give a Beta(1 + W, 1 + R) belief
  about the error of serving at ``s``; nothing known is a coin toss, so a new cache
  serves nothing until it has learned. vCache keeps no pool: its entries learn
  alone, which on entries asked about once or twice never serves at all.
- The entry: its own verdicts. Correctness grows with similarity, so a wrong
  verdict at ``s_w ≥ s`` counts against serving at ``s``, and a right verdict at
  ``s_r ≤ s`` counts for it. The pool is a prior worth ``1 / (2δ)`` verdicts (or
  what it holds, if less): one wrong verdict of its own lifts an entry's error
  estimate above δ at that similarity and below it, so it stops serving that
  neighbour; enough right ones bring it down at similarities the pool alone
  would refuse.

The cache serves the candidate when the posterior mean of its error, that is the
probability that this hit is wrong given what is known, is at most δ. The state
is bounded: ``KEPT`` verdicts per entry, stored with it (gone when it is), and two
counters per guard outcome and bin per cache name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from herd.errors import ConfigError

KEPT = 16  # verdicts an entry keeps (the newest)
BINS = 100  # similarity bins of 0.01 over [0, 1]
# The pool's estimate at similarity s uses the bins from s to s + 0.05: the error of a
# hit is that of hits near it. Every bin above s (the error of serving all of them)
# is lower where errors fall with similarity, and served more wrong answers than δ on
# a held-out benchmark sample (12.4% at δ = 0.1); a narrower window learns slower.
WINDOW = 5
PREFIX = "v"  # the pool's counters among the cache's figures: v:<a|d>:<bin>:<ok|no>
MODES = ("guarded", "bounded")
BOUNDED_FLOOR = 0.8  # the least similarity the bounded mode considers, unless given


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ConfigError(f"mode is one of {', '.join(MODES)}, not {mode!r}")
    return mode


def check_bound(value: float, what: str = "error_bound") -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value < 1
    ):
        raise ConfigError(f"{what} is a probability in (0, 1), not {value!r}")
    return float(value)


def check_recheck(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError(f"recheck is a fraction of hits in [0, 1], not {value!r}")
    return float(value)


def bin_of(similarity: float) -> int:
    return min(BINS, max(0, math.floor(similarity * BINS + 1e-9)))


def counter(agree: bool, similarity: float, correct: bool) -> str:
    """The pool counter a verdict adds to (as a figure: ``c:`` is not its prefix)."""
    return f"{PREFIX}:{'a' if agree else 'd'}:{bin_of(similarity)}:{'ok' if correct else 'no'}"


@dataclass
class Pool:
    """Verdicts of all of a cache's entries, by guard outcome and similarity bin."""

    # (agree, bin) -> [wrong, right]
    counts: dict[tuple[bool, int], list[int]] = field(default_factory=dict)

    @classmethod
    def from_figures(cls, raw: Mapping[str, int]) -> Pool:
        pool = cls()
        for name, n in raw.items():
            parts = name.split(":")
            if len(parts) != 4 or parts[0] != PREFIX or not parts[2].isdigit():
                continue
            cell = pool.counts.setdefault((parts[1] == "a", int(parts[2])), [0, 0])
            cell[parts[3] == "ok"] += int(n)
        return pool

    def add(self, agree: bool, similarity: float, correct: bool) -> None:
        cell = self.counts.setdefault((agree, bin_of(similarity)), [0, 0])
        cell[correct] += 1

    def near(self, agree: bool, similarity: float) -> tuple[int, int]:
        """Wrong and right verdicts from this similarity's bin to ``WINDOW`` bins above."""
        low = bin_of(similarity)
        wrong = right = 0
        for (a, b), (w, r) in self.counts.items():
            if a == agree and low <= b <= low + WINDOW:
                wrong, right = wrong + w, right + r
        return wrong, right


def error_probability(
    pool: Pool,
    similarity: float,
    agree: bool,
    verdicts: Iterable[tuple[float, bool]],
    bound: float,
) -> float:
    """The posterior probability that serving this candidate answers wrongly."""
    wrong, right = pool.near(agree, similarity)
    prior_mean = (wrong + 1) / (wrong + right + 2)
    weight = min(wrong + right + 2, 1 / (2 * bound))
    against = sum(1 for at, ok in verdicts if not ok and at >= similarity - 1e-9)
    for_it = sum(1 for at, ok in verdicts if ok and at <= similarity + 1e-9)
    return (prior_mean * weight + against) / (weight + against + for_it)
