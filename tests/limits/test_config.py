"""The limits file: good files, bad files (file and place named), matching, keys."""

from __future__ import annotations

import pytest

from herd.errors import ConfigError
from herd.limits import Limit, key_id
from herd.limits import load as load_file
from herd.llm.providers import registry

GOOD = """
[[limits]]
provider = "openai"
rpm = 100

[[limits]]
provider = "openai"
model = "gpt-4o-mini"
rpm = 600
tpm = 200000
max_concurrent = 32

[[limits]]
provider = "openai"
model = "gpt-4o-mini"
key = "env:HERD_TEST_LIMITS_KEY"
tpm = 1000
period = 1
"""


def load(path, providers=None):  # type: ignore[no-untyped-def]
    return load_file(path, providers=registry.names() if providers is None else providers)


def write(tmp_path, text):
    path = tmp_path / "limits.toml"
    path.write_text(text)
    return path


def test_the_most_specific_entry_wins_and_keys_are_known_by_their_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HERD_TEST_LIMITS_KEY", "sk-secret-value")
    limits = load(write(tmp_path, GOOD))
    assert limits.limit_for("openai", "gpt-4o", "nokey") == Limit(rpm=100)
    assert limits.limit_for("openai", "gpt-4o-mini", "kother") == Limit(
        rpm=600, tpm=200000, max_concurrent=32
    )
    mine = key_id("sk-secret-value")
    assert mine.startswith("k") and len(mine) == 11 and "secret" not in mine
    assert limits.limit_for("openai", "gpt-4o-mini", mine) == Limit(tpm=1000, period=1.0)
    assert not limits.limit_for("anthropic", "claude", mine)
    assert "sk-secret-value" not in repr(limits)


def test_an_entry_whose_key_variable_is_unset_is_refused(tmp_path, monkeypatch):
    # A typo in the variable's name once dropped the entry with a warning: the key ran
    # unlimited.
    monkeypatch.delenv("HERD_TEST_LIMITS_KEY", raising=False)
    path = write(tmp_path, GOOD)
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert str(caught.value) == (
        f"{path}: limits[2].key: HERD_TEST_LIMITS_KEY is not set (a typo?); set it, or remove"
        " the entry's key to limit every key"
    )


@pytest.mark.parametrize("name", ["OpenAI", "openia", "Anthropic"])
def test_a_provider_herd_does_not_know_is_refused(tmp_path, name):
    # Names are compared exactly: "OpenAI" once limited nothing, silently.
    path = write(
        tmp_path,
        f'[[limits]]\nprovider = "openai"\nrpm = 5\n[[limits]]\nprovider = "{name}"\nrpm = 5\n',
    )
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert str(caught.value) == (
        f"{path}: limits[1].provider: {name!r} is not a provider herd knows;"
        ' use "anthropic" or "openai"'
    )


def test_the_providers_an_entry_may_name_can_be_given(tmp_path):
    path = write(tmp_path, '[[limits]]\nprovider = "mine"\nrpm = 5\n')
    assert load(path, providers=["mine"]).limit_for("mine", "m", "nokey") == Limit(rpm=5)
    with pytest.raises(ConfigError, match="limits\\[0\\].provider: 'mine' is not a provider"):
        load(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[limits]]\nprovider = "openai"\nrpm = 0\n', "limits[0].rpm: must be a positive integer"),
        (
            '[[limits]]\nprovider = "openai"\nrpm = 1\n'
            '[[limits]]\nprovider = "anthropic"\ntpm = "x"\n',
            "limits[1].tpm: must be a positive integer",
        ),
        ("[[limits]]\nrpm = 5\n", "limits[0].provider: required"),
        ('[[limits]]\nprovider = "openai"\nrmp = 5\n', "limits[0].rmp: unknown field"),
        ('[[limits]]\nprovider = "openai"\n', "limits[0]: sets none of rpm, tpm, max_concurrent"),
        ('[[limits]]\nprovider = "openai"\nrpm = 1\nperiod = -1\n', "limits[0].period: must be"),
        (
            '[[limits]]\nprovider = "openai"\nrpm = 1\n[[limits]]\nprovider = "openai"\nrpm = 2\n',
            "limits[1]: same provider, model and key as limits[0]",
        ),
        ("[[limits]\n", "line 1"),
        ("[other]\nx = 1\n", "other: unknown table"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_place(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text


def test_a_key_written_in_the_file_is_refused_and_not_echoed(tmp_path):
    path = write(tmp_path, '[[limits]]\nprovider = "openai"\nkey = "sk-live-123"\nrpm = 5\n')
    with pytest.raises(ConfigError, match=r"limits\[0\]\.key: must name the variable") as caught:
        load(path)
    assert "sk-live-123" not in str(caught.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.toml: cannot be read"):
        load(tmp_path / "nope.toml")
