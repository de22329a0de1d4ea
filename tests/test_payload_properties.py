"""Properties of payload validation, on both brokers: whatever herd.jsonvalue.check accepts
round-trips through App.enqueue and get_job unchanged; whatever it refuses, App.enqueue
refuses with InvalidInput and stores nothing.

Small limits (depth 4, 300 bytes) so that bounded examples land on both sides of each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from herd.app import App
from herd.config import Settings
from herd.errors import InvalidInput, NotJSONSerializable
from herd.jsonvalue import check
from tests.conftest import flush_redis, truncate

DEPTH, SIZE = 4, 300

# Text that is mostly fine, with what stores choke on mixed in: NUL, lone surrogates,
# and the literal backslash + "u0000" that is text, not a NUL.
char = st.one_of(
    st.characters(exclude_categories=()),  # every code point, surrogates included
    st.sampled_from(["\x00", "\ud800", "\udfff", "\\", "u0000", "\\u0000", "é", "🐑"]),
)
text = st.lists(char, max_size=12).map("".join)
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    # PostgreSQL's jsonb keeps numbers as exact decimals and prints them without an
    # exponent, so a float that is a huge integer (1e23) comes back as an int: kept to
    # floats that print the same either way.
    st.floats(min_value=-1e15, max_value=1e15, allow_nan=False),
    text,
    st.integers(min_value=0, max_value=SIZE + 20).map("y".__mul__),  # around the size limit
)
tree = st.recursive(
    scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=20,
)
# Wrapped in a few more lists, so that values around the depth limit are common.
json_values = st.tuples(tree, st.integers(min_value=0, max_value=DEPTH + 1)).map(
    lambda t: wrap(t[0], t[1])
)


def wrap(value: object, times: int) -> object:
    for _ in range(times):
        value = [value]
    return value


@pytest.fixture(scope="module", params=["postgres", "redis"])
def stored(request: pytest.FixtureRequest, pg_url: str, herd_home: Path) -> Iterator[object]:
    """An App (small limits) on one broker, driven from a loop of its own: hypothesis
    calls the test body many times, each a plain function."""
    truncate(pg_url)
    config = Settings(
        home=herd_home,
        database_url=pg_url,
        broker=request.param,
        max_json_depth=DEPTH,
        max_payload_bytes=SIZE,
    )
    if request.param == "redis":
        url = request.getfixturevalue("redis_stack")
        flush_redis(url)
        config = config.override(redis_url=url)
    with asyncio.Runner() as runner:
        app = App(settings=config)
        runner.run(app.open())
        try:
            yield runner, app
        finally:
            runner.run(app.close())


async def count(app: App) -> int:
    return sum(sum(s.counts.values()) for s in await app.stats())


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(value=json_values)
@example(value=wrap(0, DEPTH))
@example(value=wrap(0, DEPTH + 1))
@example(value="x" * (SIZE - 2))
@example(value="x" * (SIZE - 1))
@example(value={"a\\u0000": ["\\\\u0000", "\\u0000"]})
@example(value={"k": "\x00"})
@example(value=["\ud800"])
def test_what_check_accepts_round_trips_and_what_it_refuses_is_never_stored(stored, value):
    runner, app = stored
    try:
        check(value, what="payload", max_depth=DEPTH, max_bytes=SIZE)
    except NotJSONSerializable as exc:
        reason = next(w for w in ("NUL", "surrogate", "deep", "bytes") if w in str(exc))
        event(f"refused: {reason}")
        before = runner.run(count(app))
        with pytest.raises(InvalidInput):
            runner.run(app.enqueue("t", value))
        assert runner.run(count(app)) == before
        return
    event("accepted")
    r = runner.run(app.enqueue("t", value))
    assert r.created
    assert runner.run(app.get_job(r.job_id)).payload == value
