"""What App.enqueue refuses (and keeps intact): the one gate every producer goes through,
on both brokers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from herd.app import App
from herd.config import Settings
from herd.errors import InvalidInput
from tests.conftest import flush_redis, truncate


@pytest.fixture(params=["postgres", "redis"])
async def app(request: pytest.FixtureRequest, pg_url: str, herd_home: Path) -> AsyncIterator[App]:
    truncate(pg_url)
    settings = Settings(home=herd_home, database_url=pg_url, broker=request.param)
    if request.param == "redis":
        url = request.getfixturevalue("redis_stack")
        flush_redis(url)
        settings = settings.override(redis_url=url)
    async with App(settings=settings) as the_app:
        yield the_app


def nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


BAD = [
    ({"task": "a\x00b"}, "task", "NUL"),
    ({"task": "a\ud800"}, "task", "lone surrogate"),
    ({"task": "t" * 201}, "task", "limit is 200"),
    ({"queue": "q\x00"}, "queue", "NUL"),
    ({"queue": "\udcff"}, "queue", "lone surrogate"),
    ({"dedup_key": "k\x00"}, "dedup_key", "NUL"),
    ({"dedup_key": "\ud800"}, "dedup_key", "lone surrogate"),
    ({"dedup_key": ""}, "dedup_key", "empty"),
    ({"priority": 2**31}, "priority", "-1000000 to 1000000"),
    ({"priority": -(10**30)}, "priority", "-1000000 to 1000000"),
    ({"priority": "high"}, "priority", "integer"),
    ({"delay": float("inf")}, "delay", "finite"),
    ({"payload": {"a": ["ok", "nul\x00"]}}, "payload.a[1]", "NUL"),
    ({"payload": {"key\ud800": 1}}, "payload", "lone surrogate"),
    ({"payload": nested(300)}, "payload", "HERD_MAX_JSON_DEPTH"),
]


@pytest.mark.parametrize(("given", "field", "says"), BAD, ids=[f"{b[1]}-{b[2]}" for b in BAD])
async def test_a_bad_field_is_refused_naming_it_and_nothing_is_stored(app, given, field, says):
    kw = {"task": "t", "payload": {"fine": 1}, **given}
    with pytest.raises(InvalidInput) as caught:
        await app.enqueue(kw.pop("task"), kw.pop("payload"), **kw)
    assert caught.value.field == field and says in str(caught.value)
    assert field.split(".")[0].split("[")[0] in str(caught.value)
    assert await app.list_jobs() == []


async def test_depth_and_size_limits_come_from_the_settings(app):
    app.settings = app.settings.override(max_json_depth=5, max_payload_bytes=100)
    await app.enqueue("t", nested(5))
    with pytest.raises(InvalidInput, match="more than 5 levels deep"):
        await app.enqueue("t", nested(6))
    await app.enqueue("t", "x" * 98)  # 100 bytes as JSON, quotes included
    with pytest.raises(InvalidInput, match=r"101 bytes as JSON; the limit is 100 \(HERD_MAX_PAY"):
        await app.enqueue("t", "x" * 99)
    assert len(await app.list_jobs()) == 2


async def test_a_hundred_megabyte_payload_is_refused_by_default(app):
    with pytest.raises(InvalidInput, match="the limit is 1048576 .HERD_MAX_PAYLOAD_BYTES"):
        await app.enqueue("t", {"blob": "x" * (100 << 20)})
    assert await app.list_jobs() == []


async def test_enqueue_many_refuses_all_when_one_payload_is_bad_and_names_it(app):
    with pytest.raises(InvalidInput) as caught:
        await app.enqueue_many("t", [{"n": 1}, {"n": 2}, {"n": "\x00"}], batch_size=1)
    assert caught.value.field == "payloads[2].n"
    assert await app.list_jobs() == []


async def test_a_literal_backslash_u0000_is_text_and_round_trips_in_every_field(app):
    text = "a\\u0000b \\\\u0000"  # a backslash then "u0000": no NUL anywhere
    payload = {text: [text, {"s": "\\u0000"}]}
    r = await app.enqueue(text, payload, queue="q" + text, dedup_key=text)
    job = await app.get_job(r.job_id)
    assert (job.task, job.queue, job.dedup_key, job.payload) == (text, "q" + text, text, payload)
    again = await app.enqueue(text, None, queue="q" + text, dedup_key=text)
    assert not again.created and again.job_id == r.job_id
