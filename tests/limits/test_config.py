"""The limits file: good files, bad files (file and place named), matching, keys."""

from __future__ import annotations

import pytest

from herd.errors import ConfigError
from herd.limits import Limit, key_id
from herd.limits import load as load_file
from herd.llm.providers import registry
from herd.masking import mask

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


POOL = """
[[limits]]
provider = "openai"
key = ["env:HERD_TEST_POOL_A", "env:HERD_TEST_POOL_B"]
rpm = 600

[[limits]]
provider = "openai"
key = "env:HERD_TEST_POOL_B"
rpm = 300

[[limits]]
provider = "openai"
model = "gpt-4o"
key = ["env:HERD_TEST_POOL_B", "env:HERD_TEST_POOL_A"]
tpm = 1000
"""


def test_a_pool_names_several_keys_each_with_its_own_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("HERD_TEST_POOL_A", "sk-pool-secret-a")
    monkeypatch.setenv("HERD_TEST_POOL_B", "sk-pool-secret-b")
    limits = load(write(tmp_path, POOL))
    a, b = key_id("sk-pool-secret-a"), key_id("sk-pool-secret-b")
    pool = limits.pool_for("openai", "gpt-4o-mini")
    assert [(k.variable, k.id) for k in pool] == [("HERD_TEST_POOL_A", a), ("HERD_TEST_POOL_B", b)]
    # The pool's limits are each key's own; a key's own entry wins over the pool's.
    assert [k.limit for k in pool] == [Limit(rpm=600), Limit(rpm=300)]
    # An exact model's pool over the "*" one, in its own order.
    assert [k.variable for k in limits.pool_for("openai", "gpt-4o")] == [
        "HERD_TEST_POOL_B", "HERD_TEST_POOL_A"
    ]  # fmt: skip
    assert limits.pool_for("anthropic", "claude") == ()
    assert limits.variables() == {a: "HERD_TEST_POOL_A", b: "HERD_TEST_POOL_B"}
    assert "sk-pool-secret" not in repr(limits)
    # Any key outside the pool is limited as before: no entry.
    assert not limits.limit_for("openai", "gpt-4o-mini", "kother")


def test_a_file_without_pools_reads_as_before(tmp_path, monkeypatch):
    monkeypatch.setenv("HERD_TEST_LIMITS_KEY", "sk-secret-value")
    limits = load(write(tmp_path, GOOD))
    assert limits.pool_for("openai", "gpt-4o-mini") == ()


def test_a_pool_key_that_is_not_set_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HERD_TEST_POOL_A", "sk-pool-secret-a")
    monkeypatch.delenv("HERD_TEST_POOL_B", raising=False)
    path = write(tmp_path, POOL)
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert str(caught.value) == (
        f"{path}: limits[0].key[1]: HERD_TEST_POOL_B is not set (a typo?); set it, or"
        " remove it from the pool"
    )


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ('["env:HERD_TEST_POOL_A"]', "limits[0].key: a pool names 2 to 16 keys, not 1"),
        ('["env:HERD_TEST_POOL_A", "sk-live-123"]', "limits[0].key[1]: must name the variable"),
        (
            '["env:HERD_TEST_POOL_A", "env:HERD_TEST_POOL_SAME"]',
            "limits[0].key[1]: HERD_TEST_POOL_SAME holds the same key as another of the pool",
        ),
    ],
)
def test_a_bad_pool_is_refused(tmp_path, monkeypatch, keys, message):
    monkeypatch.setenv("HERD_TEST_POOL_A", "sk-pool-secret-a")
    monkeypatch.setenv("HERD_TEST_POOL_SAME", "sk-pool-secret-a")
    path = write(tmp_path, f'[[limits]]\nprovider = "openai"\nkey = {keys}\nrpm = 5\n')
    with pytest.raises(ConfigError) as caught:
        load(path)
    assert message in str(caught.value) and "sk-" not in str(caught.value)


def test_a_key_in_two_pools_of_one_model_is_refused(tmp_path, monkeypatch):
    for name in ("HERD_TEST_POOL_A", "HERD_TEST_POOL_B", "HERD_TEST_POOL_C"):
        monkeypatch.setenv(name, f"sk-{name}")
    one = '[[limits]]\nprovider = "openai"\nkey = ["env:HERD_TEST_POOL_A", "env:{}"]\nrpm = 5\n'
    path = write(tmp_path, one.format("HERD_TEST_POOL_B") + one.format("HERD_TEST_POOL_C"))
    with pytest.raises(ConfigError, match=r"limits\[1\]\.key: HERD_TEST_POOL_A is in the pool"):
        load(path)


def test_a_pool_key_is_masked_even_in_a_numbered_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("HERD_TEST_POOL_A", "sk-pool-secret-a")
    monkeypatch.setenv("HERD_TEST_POOL_B", "sk-pool-secret-b")
    load(write(tmp_path, POOL))
    assert mask("key sk-pool-secret-b refused") == "key **** refused"
