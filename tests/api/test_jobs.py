"""Job and dead-letter endpoints, on both brokers."""

from __future__ import annotations

import pytest

from herd.queue.base import Completion, DeadReason, Failure
from tests.api.conftest import client_of
from tests.helpers import eventually, job

INJECTIONS = [
    "'); DROP TABLE herd_jobs; --",
    "' OR 1=1 --",
    'Robert"); DELETE FROM herd_jobs WHERE ("1"="1',
    "ünïcødé ✓ 你好 🐑 \u202e",
]


async def test_enqueue_then_get_returns_the_job(any_client):
    r = await any_client.post("/jobs", json={"task": "t.echo", "payload": {"x": [1, 2]}})
    assert r.status_code == 201
    job_id = r.json()["job_id"]
    assert r.json()["created"] is True
    got = await any_client.get(f"/jobs/{job_id}")
    assert got.status_code == 200
    body = got.json()
    assert body["task"] == "t.echo" and body["payload"] == {"x": [1, 2]}
    assert body["status"] == "pending" and body["queue"] == "default"


async def test_missing_job_is_404(any_client):
    r = await any_client.get("/jobs/987654")
    assert r.status_code == 404
    assert "987654" in r.json()["error"]


@pytest.mark.parametrize("text", INJECTIONS)
async def test_sql_injection_strings_are_stored_and_returned_verbatim(any_client, text):
    queue = text.replace("{", "").replace("}", "")
    r = await any_client.post(
        "/jobs",
        json={
            "task": text,
            "payload": {"s": text, text: [text]},
            "queue": queue,
            "dedup_key": text,
        },
    )
    assert r.status_code == 201, r.text
    job = (await any_client.get(f"/jobs/{r.json()['job_id']}")).json()
    assert job["task"] == text and job["queue"] == queue and job["dedup_key"] == text
    assert job["payload"] == {"s": text, text: [text]}
    listed = (await any_client.get("/jobs", params={"queue": queue})).json()
    assert [j["id"] for j in listed] == [job["id"]]
    again = await any_client.post("/jobs", json={"task": text, "queue": queue, "dedup_key": text})
    assert again.status_code == 200 and again.json() == {"job_id": job["id"], "created": False}
    assert (await any_client.get("/jobs", params={"queue": "' OR 1=1 --x"})).json() == []


async def test_list_jobs_filters_by_status_and_queue_newest_first(any_client, any_app):
    ids = [
        (await any_client.post("/jobs", json={"task": "t", "queue": q})).json()["job_id"]
        for q in ("a", "b", "a")
    ]
    (lease,) = await any_app.broker.claim(["b"], "w", 1)
    a = (await any_client.get("/jobs", params={"queue": "a"})).json()
    assert [j["id"] for j in a] == [ids[2], ids[0]]
    running = (await any_client.get("/jobs", params={"status": "processing"})).json()
    assert [j["id"] for j in running] == [lease.job_id] == [ids[1]]
    assert len((await any_client.get("/jobs", params={"limit": 1})).json()) == 1


async def dead_job(app, queue="default", **kw):
    (r,) = await app.broker.enqueue([job(queue=queue, **kw)])
    (lease,) = await app.broker.claim([queue], "w-1", 1)
    await app.broker.fail_if_leased(
        Failure(lease, "ValueError: boom", "Traceback…", final=True, reason=DeadReason.FATAL)
    )
    return r.job_id


async def test_dead_letters_are_listed_with_reason_and_requeued(any_client, any_app):
    first = await dead_job(any_app)
    second = await dead_job(any_app, queue="other")
    dlq = (await any_client.get("/dlq")).json()
    assert [j["id"] for j in dlq] == [second, first]
    assert dlq[0]["dead_reason"] == "fatal" and dlq[0]["last_error"] == "ValueError: boom"
    assert [j["id"] for j in (await any_client.get("/dlq", params={"queue": "other"})).json()] == [
        second
    ]
    r = await any_client.post("/dlq/requeue", json={"job_ids": [first, 424242]})
    assert r.status_code == 200
    assert r.json() == {"requeued": [first], "missing": [424242], "skipped": []}
    assert (await any_client.get(f"/jobs/{first}")).json()["status"] == "pending"
    r = await any_client.post("/dlq/requeue", json={"all": True})
    assert r.json() == {"requeued": [second], "missing": [], "skipped": []}
    assert (await any_client.get("/dlq")).json() == []


async def test_requeue_skips_a_job_whose_dedup_key_is_held_and_names_the_holder(
    any_client, any_app
):
    held = await dead_job(any_app, dedup_key="k1")
    plain = await dead_job(any_app, queue="other")
    holder = (await any_client.post("/jobs", json={"task": "t", "dedup_key": "k1"})).json()
    for body in ({"all": True}, {"job_ids": [held, 424242]}):
        r = await any_client.post("/dlq/requeue", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["skipped"] == [
            {"job_id": held, "dedup_key": "k1", "held_by": holder["job_id"]}
        ]
    assert r.json() == {
        "requeued": [],
        "missing": [424242],
        "skipped": [{"job_id": held, "dedup_key": "k1", "held_by": holder["job_id"]}],
    }
    assert (await any_client.get(f"/jobs/{plain}")).json()["status"] == "pending"
    assert (await any_client.get(f"/jobs/{held}")).json()["status"] == "dead"


async def test_stats_count_jobs_per_queue_and_status(any_client, any_app):
    for q in ("a", "a", "b"):
        await any_client.post("/jobs", json={"task": "t", "queue": q})
    await dead_job(any_app, queue="b")
    stats = (await any_client.get("/stats")).json()
    by_queue = {q["queue"]: q for q in stats["queues"]}
    assert by_queue["a"]["counts"]["pending"] == 2 and by_queue["a"]["ready"] == 2
    assert by_queue["b"]["counts"] == {"pending": 1, "dead": 1}
    assert isinstance(stats["caches"], list)


def nested(depth):
    value = "leaf"
    for _ in range(depth):
        value = [value]
    return value


# Raw bodies: a lone surrogate is valid JSON text ("\ud800") that no client library sends.
BAD_FIELDS = [
    ('{"task": "a\\u0000b"}', "task", "NUL"),
    ('{"task": "a\\ud800"}', "task", "surrogate"),
    ('{"task": "t", "queue": "q\\u0000"}', "queue", "NUL"),
    ('{"task": "t", "queue": "\\udfff"}', "queue", "surrogate"),
    ('{"task": "t", "dedup_key": "k\\u0000"}', "dedup_key", "NUL"),
    ('{"task": "t", "dedup_key": "\\ud800x"}', "dedup_key", "surrogate"),
    ('{"task": "t", "priority": 2147483648}', "priority", "1000000"),
    ('{"task": "t", "priority": -1e30}', "priority", ""),
    ('{"task": "t", "payload": {"a": "\\u0000"}}', "payload.a", "NUL"),
    ('{"task": "t", "payload": ["\\ud800"]}', "payload[0]", "lone surrogate"),
]


@pytest.mark.parametrize(("raw", "field", "says"), BAD_FIELDS)
async def test_bad_characters_and_priorities_are_422_naming_the_field(any_client, raw, field, says):
    r = await any_client.post(
        "/jobs", content=raw.encode(), headers={"content-type": "application/json"}
    )
    assert r.status_code == 422, r.text
    (error,) = r.json()["errors"]
    assert error["field"] == field and says in error["reason"]
    assert (await any_client.get("/jobs")).json() == []


async def test_a_literal_backslash_u0000_is_text_end_to_end(any_client):
    text = "a\\u0000b"  # a backslash then "u0000": not a NUL
    body = {"task": text, "payload": {text: text}, "queue": text, "dedup_key": text}
    r = await any_client.post("/jobs", json=body)
    assert r.status_code == 201, r.text
    job = (await any_client.get(f"/jobs/{r.json()['job_id']}")).json()
    assert {k: job[k] for k in body} == body
    (listed,) = (await any_client.get("/jobs")).json()
    assert listed["payload_excerpt"] == '{"a\\\\u0000b":"a\\\\u0000b"}'


async def test_a_payload_nested_300_deep_is_422_and_every_listing_stays_up(any_client):
    r = await any_client.post("/jobs", json={"task": "t", "payload": {"x": nested(300)}})
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "payload"
    assert "nested more than 64 levels deep" in r.json()["error"]
    assert "HERD_MAX_JSON_DEPTH" in r.json()["error"]
    ok = await any_client.post("/jobs", json={"task": "t", "payload": nested(60)})
    assert ok.status_code == 201
    for path in ("/jobs", f"/jobs/{ok.json()['job_id']}", "/overview", "/dlq"):
        assert (await any_client.get(path)).status_code == 200, path


async def test_a_payload_over_the_size_limit_is_422_naming_the_setting(any_client, any_app):
    any_app.settings = any_app.settings.override(max_payload_bytes=1000)
    r = await any_client.post("/jobs", json={"task": "t", "payload": "x" * 1000})
    assert r.status_code == 422
    assert "1002 bytes as JSON; the limit is 1000 (HERD_MAX_PAYLOAD_BYTES)" in r.json()["error"]
    assert r.json()["errors"][0]["field"] == "payload"


async def test_listings_carry_excerpts_and_only_get_job_the_whole_payload(any_client, any_app):
    big = {"text": "x" * 500_000}
    ids = [
        (await any_client.post("/jobs", json={"task": "t", "payload": big})).json()["job_id"]
        for _ in range(3)
    ]
    (lease,) = await any_app.broker.claim(["default"], "w", 1)
    await any_app.broker.complete_if_leased([Completion(lease, {"answer": "y" * 500_000})])
    await dead_job(any_app, payload=big)
    listed = await any_client.get("/jobs")
    assert len(listed.content) < 20_000
    rows = {j["id"]: j for j in listed.json()}
    assert set(rows) > set(ids)
    done = rows[lease.job_id]
    assert "payload" not in done and "result" not in done and "last_traceback" not in done
    payload, result = done["payload_excerpt"], done["result_excerpt"]
    assert payload.startswith('{"text":"xxx') and payload[-1] == "…" and len(payload) == 200
    assert result.startswith('{"answer":"yyy') and len(result) == 200
    assert rows[ids[1]]["result_excerpt"] is None
    for path in ("/overview", "/dlq"):
        r = await any_client.get(path)
        assert r.status_code == 200 and len(r.content) < 20_000, path
    ov = (await any_client.get("/overview")).json()
    assert ov["recent"][0]["payload_excerpt"].startswith('{"text":"xxx')
    whole = (await any_client.get(f"/jobs/{lease.job_id}")).json()
    assert whole["payload"] == big and whole["result"] == {"answer": "y" * 500_000}


@pytest.mark.parametrize("task", ["herd.eval", "herd.rag.embed", "herd.rag.finalize", "herd.x"])
async def test_herds_internal_tasks_cannot_be_enqueued_through_post_jobs(any_client, task):
    r = await any_client.post("/jobs", json={"task": task, "payload": {"key": "forged"}})
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "task" and "internal to herd" in r.json()["error"]
    assert (await any_client.get("/jobs")).json() == []


def test_every_built_in_task_is_named_under_the_refused_prefix():
    from herd.builtin import tasks
    from herd.tasks import is_internal

    assert tasks.tasks and all(is_internal(name) for name in tasks.tasks)


async def test_a_server_given_an_app_with_tasks_refuses_unknown_task_names(pg_app):
    @pg_app.task(name="reports.nightly")
    def nightly(payload):
        return None

    async with client_of(pg_app) as c:
        assert (await c.post("/jobs", json={"task": "reports.nightly"})).status_code == 201
        r = await c.post("/jobs", json={"task": "reports.nighlty"})
        assert r.status_code == 422
        assert "unknown task 'reports.nighlty'" in r.json()["error"]
        assert r.json()["errors"][0]["field"] == "task"
        assert len((await c.get("/jobs")).json()) == 1


async def test_dead_letters_are_purged_by_age_and_queue(any_client, any_app):
    kept = await dead_job(any_app)
    gone = await dead_job(any_app, queue="other")
    r = await any_client.post("/dlq/purge", json={"older_than": -1})
    assert r.status_code == 422 and "older_than" in r.text
    r = await any_client.post("/dlq/purge", json={"older_than": 3600})
    assert r.status_code == 200 and r.json() == {"purged": 0}

    async def purged() -> bool:
        r = await any_client.post("/dlq/purge", json={"older_than": 0, "queue": "other"})
        return r.json()["purged"] == 1

    await eventually(purged)
    assert [j["id"] for j in (await any_client.get("/dlq")).json()] == [kept]
    assert (await any_client.get(f"/jobs/{gone}")).status_code == 404


async def test_enqueue_with_a_concurrency_key_and_stats_by_key(any_client, any_app):
    for _ in range(3):
        r = await any_client.post(
            "/jobs",
            json={"task": "t.echo", "concurrency_key": "tenant:acme", "max_running_per_key": 2},
        )
        assert r.status_code == 201, r.text
    body = (await any_client.get(f"/jobs/{r.json()['job_id']}")).json()
    assert body["concurrency_key"] == "tenant:acme"
    assert len(await any_app.broker.claim(["default"], "w", 10)) == 2  # the key's limit
    stats = (await any_client.get("/stats/keys", params={"limit": 5})).json()
    assert stats == {
        "keys": [
            {
                "queue": "default",
                "key": "tenant:acme",
                "running": 2,
                "waiting": 1,
                "max_running": 2,
            }
        ]
    }
    bad = await any_client.post(
        "/jobs", json={"task": "t.echo", "concurrency_key": "k", "max_running_per_key": 0}
    )
    assert bad.status_code == 422 and "max_running_per_key" in bad.text
    # The dashboard's poll carries the same rows (its Concurrency keys panel).
    assert (await any_client.get("/overview")).json()["keys"] == stats["keys"]
