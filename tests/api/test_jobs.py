"""Job and dead-letter endpoints, on both brokers."""

from __future__ import annotations

import pytest

from herd.queue.base import DeadReason, Failure
from tests.helpers import job

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
