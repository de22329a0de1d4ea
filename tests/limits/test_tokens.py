"""Token estimates: never under the provider's count, output from the request's bounds."""

from __future__ import annotations

import math

import pytest

from herd.limits import estimate, estimate_input, estimate_output
from herd.testing.simulator.content import estimate_tokens

ENGLISH = "The quick brown fox jumps over the lazy dog, and then reads the whole Bible. " * 20
CJK = "東京は日本の首都です。春には桜が咲きます。" * 20
MIXED = "Summarise 第一章 in three bullet points: ```def f(x): return x**2```"


@pytest.mark.parametrize("text", [ENGLISH, CJK, MIXED, "a", ""])
def test_the_input_estimate_is_never_below_the_simulators_count(text):
    system = "You are terse."
    counted = estimate_tokens(system) + estimate_tokens(text)
    assert estimate_input("openai", "gpt-4o-mini", system, text) >= counted


def test_cjk_counts_a_token_a_character_at_least():
    assert estimate_input("anthropic", "claude", "", CJK) >= len(CJK)
    assert estimate_input("openai", "gpt-4o", "", CJK) > 3 * math.ceil(len(CJK) / 4)


def test_the_output_comes_from_max_tokens_by_any_of_its_names():
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        assert estimate_output({name: 321}, None, 4096) == 321
    assert estimate_output({}, None, 4096) == 4096
    assert estimate_output({"max_tokens": True}, None, 77) == 77


def test_the_output_of_a_bounded_schema_is_bounded_by_it():
    schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "label": {"enum": ["yes", "no", "unsure"]},
            "score": {"type": "number"},
            "why": {"type": "string", "maxLength": 200},
        },
    }
    bound = estimate_output({}, schema, 4096)
    assert 200 < bound < 300
    assert estimate_output({}, schema, 100) == 100  # never above default_max
    open_schema = {"type": "object", "properties": {"why": {"type": "string"}}}
    assert estimate_output({}, open_schema, 4096) == 4096
    refs = {"$defs": {"s": {"type": "string", "maxLength": 10}}, "$ref": "#/$defs/s"}
    assert estimate_output({}, refs, 4096) == 12


def test_estimate_adds_input_and_output():
    total = estimate("openai", "m", "sys", "user", {"max_tokens": 50}, None, 4096)
    assert total == estimate_input("openai", "m", "sys", "user") + 50
