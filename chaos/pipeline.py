"""The chaos run's pipeline workload: manuals evaluated in three stages (split by heading,
a note per section, one summary per manual) on the same workers and the evaluations'
simulator, while the faults land. Some sections repeat across manuals, so a key is
shared by pieces of several documents (one call, the rest from the cache or the
singleflight).

The reduce runs under a model of its own, so that the simulator's count of its calls
is the reduce calls alone: the checker holds it to one per distinct reduce input,
apart from calls cut short by a fault (guarantee 9, chaos/checker.py).
"""

from __future__ import annotations

import random

from herd.llm.eval.pipeline import Pipeline, from_json

MAP_MODEL = "sim-chaos-map"
REDUCE_MODEL = "sim-chaos-reduce"
MAP_STAGE, REDUCE_STAGE = "notes", "summary"
SHARED_SECTIONS = 6  # a pool of sections that several manuals carry word for word
_WORDS = (
    "register", "clock", "reset", "enable", "mask", "status", "buffer", "interrupt",
    "voltage", "latch", "offset", "timer", "channel", "parity", "the", "bit", "field",
)  # fmt: skip


def pipeline() -> Pipeline:
    return from_json({
        "name": "chaos-manuals",
        "stages": [
            {"name": "sections", "kind": "split", "by": "headings", "depth": 2},
            {"name": MAP_STAGE, "kind": "map", "model": MAP_MODEL,
             "prompt": "Note what this section says a register does. Answer in JSON.",
             "schema": {"type": "object", "properties": {"note": {"type": "string"}},
                        "required": ["note"]}},
            {"name": REDUCE_STAGE, "kind": "reduce", "model": REDUCE_MODEL,
             "prompt": "Summarise the manual from its notes. Answer in JSON.",
             "schema": {"type": "object", "properties": {"summary": {"type": "string"}},
                        "required": ["summary"]}},
        ],
    })  # fmt: skip


def _section(rng: random.Random, title: str) -> str:
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(15, 40)))
    return f"## {title}\n\n{words.capitalize()}."


def manuals(rng: random.Random, n: int, sections: tuple[int, int]) -> dict[str, str]:
    """``n`` manuals of ``sections`` (low, high) sections each, some from a shared pool."""
    pool = [_section(rng, f"Shared register {i}") for i in range(SHARED_SECTIONS)]
    out = {}
    for d in range(n):
        parts = [f"# Manual {d}\n\nThe reference manual of device {d}."]
        for s in range(rng.randint(*sections)):
            shared = rng.random() < 0.3
            parts.append(rng.choice(pool) if shared else _section(rng, f"Register {d}.{s}"))
        out[f"manual-{d:03d}.md"] = "\n\n".join(parts) + "\n"
    return out
