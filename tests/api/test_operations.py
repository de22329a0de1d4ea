"""/metrics, /healthz and /overview read the real stores."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

import herd
from herd.api import create_app, overview
from herd.app import App
from herd.cache import ExactCache
from herd.config import Settings
from herd.llm.eval import EvalRuntime
from herd.queue.base import Completion
from tests.api.conftest import client_of
from tests.api.test_jobs import dead_job
from tests.helpers import count_checkout_checks, drop_connections, own_connections, truncate


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_parse_and_count_queues_caches_and_the_ledger(any_client, any_app):
    for q in ("a", "a", "b"):
        await any_client.post("/jobs", json={"task": "t", "queue": q})
    (lease,) = await any_app.broker.claim(["b"], "w", 1)
    await any_app.broker.complete_if_leased([Completion(lease, 1)])
    await any_client.post("/jobs", json={"task": "t", "queue": "b"})
    await any_app.broker.claim(["b"], "w", 1)
    await dead_job(any_app, queue="c")
    rt = await EvalRuntime.of(any_app)
    cache: ExactCache = rt.cache
    await cache.get_or_compute("k", lambda: _value())  # a miss, computed
    await cache.get_or_compute("k", lambda: _value())  # a hit
    for kind, cost in (("call", 0.5), ("cache", None), ("dedup", None)):
        await rt.store.record(batch="b", job_id=7, key="k1", kind=kind, input_tokens=10, cost=cost)

    r = await any_client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    m = samples(r.text)
    assert m[("herd_build_info", (("version", herd.__version__),))] == 1
    assert m[("herd_queue_jobs", (("queue", "a"), ("status", "pending")))] == 2
    assert m[("herd_queue_ready", (("queue", "a"),))] == 2
    assert m[("herd_jobs_running", (("queue", "b"),))] == 1
    assert m[("herd_jobs_succeeded_retained", (("queue", "b"),))] == 1
    assert m[("herd_jobs_dead_lettered", (("queue", "c"),))] == 1
    ns = (("cache", "exact"), ("namespace", "eval"))
    assert m[("herd_cache_hits_total", ns)] == 1 and m[("herd_cache_misses_total", ns)] == 1
    assert m[("herd_cache_entries", ns)] == 1
    assert m[("herd_eval_ledger_calls_total", (("kind", "call"),))] == 1
    assert m[("herd_eval_ledger_cost_dollars_total", (("kind", "call"),))] == 0.5
    assert m[("herd_eval_ledger_tokens_total", (("direction", "input"), ("kind", "call")))] == 10
    # The avoided calls are worth what the key's call cost.
    assert m[("herd_eval_ledger_saved_dollars_total", (("kind", "cache"),))] == 0.5
    assert m[("herd_eval_ledger_saved_dollars_total", (("kind", "dedup"),))] == 0.5


async def _value():
    return {"answer": 42}


async def test_two_apps_in_one_process_keep_their_own_metrics(pg_app, pg_url, herd_home):
    async with client_of(pg_app) as one:
        await one.post("/jobs", json={"task": "t", "queue": "only-one"})
        first = (await one.get("/metrics")).text
        second_api = create_app(pg_app)
        async with second_api.router.lifespan_context(second_api):
            pass
        again = (await one.get("/metrics")).text
    assert first.count("only-one") == again.count("only-one") > 0


async def test_healthz_ok_then_down_with_the_reason(pg_app, pg_url, herd_home):
    async with client_of(pg_app) as c:
        r = await c.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "version": herd.__version__, "checks": {"database": "ok"}}
    # Redis configured but nothing listens there: down, and says which and why.
    settings = Settings(home=herd_home, database_url=pg_url, redis_url="redis://:pw@127.0.0.1:1/0")
    async with App(settings=settings) as app, client_of(app) as c:
        r = await c.get("/healthz")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "down" and body["checks"]["database"] == "ok"
    assert body["checks"]["redis"].startswith("Redis at redis://:****@127.0.0.1:1/0")
    assert "pw" not in r.text


async def test_overview_has_everything_the_dashboard_shows(any_client, any_app):
    await any_client.post("/jobs", json={"task": "known.task", "payload": {"n": 1}})
    await any_client.post("/jobs", json={"task": "leased", "queue": "q2"})
    (lease,) = await any_app.broker.claim(["q2"], "w-9", 1)
    dead = await dead_job(any_app, queue="q3")
    ov = (await any_client.get("/overview", params={"minutes": 10})).json()
    assert ov["broker"] == any_app.broker.name
    assert {q["queue"] for q in ov["queues"]} == {"default", "q2", "q3"}
    (running,) = ov["running"]
    assert (
        running["id"] == lease.job_id and running["owner"] == "w-9" and running["lease_left"] > 20
    )
    assert [j["id"] for j in ov["dead"]] == [dead]
    assert "known.task" in [j["task"] for j in ov["recent"]]
    assert ov["throughput"]["minutes"] == 10 and sum(ov["throughput"]["dead"]) == 1
    assert [row["kind"] for row in ov["ledger"]] == [
        "call",
        "lost",
        "failed",
        "cut_short",
        "cache",
        "singleflight",
        "dedup",
    ]
    assert isinstance(ov["limits"], list)  # the fleet's provider limits (other tests add some)
    assert ov["problems"] == []


async def test_openapi_schema_lists_the_routes(client):
    schema = (await client.get("/openapi.json")).json()
    for path in (
        "/jobs",
        "/jobs/{job_id}",
        "/dlq",
        "/dlq/requeue",
        "/evals",
        "/query",
        "/metrics",
        "/healthz",
        "/stats",
        "/overview",
    ):
        assert path in schema["paths"], path


async def test_caches_that_cannot_be_read_are_problems_not_an_outage(clean_pg, herd_home):
    settings = Settings(
        home=herd_home, database_url=clean_pg, cache="redis", redis_url="redis://127.0.0.1:1/0"
    )
    async with App(settings=settings) as app, client_of(app) as c:
        await c.post("/jobs", json={"task": "t", "queue": "still-up"})
        ov = await c.get("/overview")
        assert ov.status_code == 200
        body = ov.json()
        assert [q["queue"] for q in body["queues"]] == ["still-up"]
        problems = " | ".join(body["problems"])
        assert "exact cache:" in problems and "semantic cache:" in problems
        assert "127.0.0.1:1" in problems
        m = samples((await c.get("/metrics")).text)
        assert m[("herd_scrape_problems", (("section", "exact cache"),))] == 1
        assert m[("herd_queue_jobs", (("queue", "still-up"), ("status", "pending")))] == 1


async def test_overview_cards_read_no_items_of_an_idle_batch(client, pg_app, monkeypatch):
    """A poll reads the items of batches with work queued or running only: a finished or
    parked batch's card is kept until its row changes (a later submission, a park)."""
    from herd.llm.eval import BatchStatus, EvalSpec, submit_texts

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # checked at submit; no call is made
    spec = EvalSpec(model="sim-small", system="Grade it.", schema={"type": "object"})
    await submit_texts(pg_app, spec, {"a.txt": "A.", "b.txt": "B."}, batch="finished-1")
    for lease in await pg_app.broker.claim(["eval"], "w-1", 2):
        done = Completion(lease, {"source": "call", "output": {}})
        assert await pg_app.broker.complete_if_leased([done]) == [True]
    await submit_texts(pg_app, spec, {"c.txt": "C."}, batch="active-1")
    read: list[str] = []
    status = overview.batch_status

    async def counting(app: App, batch: str | None) -> BatchStatus:
        read.append(str(batch))
        return await status(app, batch)

    monkeypatch.setattr(overview, "batch_status", counting)
    cards = {c["batch"]: c for c in (await client.get("/overview")).json()["batches"]}
    assert list(cards) == ["active-1", "finished-1"] and read == ["active-1", "finished-1"]
    assert (cards["finished-1"]["done"], cards["finished-1"]["documents"]) == (2, 2)
    assert (cards["active-1"]["queued"], cards["active-1"]["documents"]) == (1, 1)
    assert cards["active-1"]["next"] is None and cards["active-1"]["parked"] is None
    read.clear()
    again = (await client.get("/overview")).json()["batches"]
    assert read == ["active-1"] and again[1] == cards["finished-1"]
    await submit_texts(pg_app, spec, {"d.txt": "D."}, batch="finished-1")
    read.clear()
    cards = {c["batch"]: c for c in (await client.get("/overview")).json()["batches"]}
    assert sorted(read) == ["active-1", "finished-1"]
    assert (cards["finished-1"]["done"], cards["finished-1"]["queued"]) == (2, 1)
    # Parked with nothing in flight: read once after the park, then kept too.
    rt = await EvalRuntime.of(pg_app)
    await rt.store.park("active-1", "budget", "its budget is spent")
    read.clear()
    cards = {c["batch"]: c for c in (await client.get("/overview")).json()["batches"]}
    # (finished-1 has a document queued again: read on every poll)
    assert read == ["active-1", "finished-1"] and cards["active-1"]["parked"] == "budget"
    assert (cards["active-1"]["queued"], cards["active-1"]["parked_items"]) == (0, 1)
    assert cards["active-1"]["next"] == "herd eval budget active-1 USD"
    read.clear()
    await client.get("/overview")
    assert read == ["finished-1"]
    # An evaluation job goes by its document's path in the jobs views.
    labels = {j["label"] for j in (await client.get("/overview")).json()["recent"]}
    assert labels == {"a.txt", "b.txt", "c.txt", "d.txt"}


async def test_a_poll_sends_no_connection_check_yet_survives_dropped_connections(
    pg_url, herd_home, monkeypatch
):
    """Every read of a poll is safe to send twice, so none waits for the pool's checkout
    check on a connection fresh from a statement (eight of a poll's nineteen round trips
    were checks), and one the server dropped is sent again on a checked connection."""
    truncate(pg_url)
    url, tag = own_connections(pg_url)
    checks = count_checkout_checks(monkeypatch)
    async with App(settings=Settings(home=herd_home, database_url=url)) as app:
        await app.enqueue("t", {}, queue="polled")
        await overview.overview(app)  # every store opened, its pool warm
        checks.clear()
        seen = await overview.overview(app)
        assert checks == [] and seen.problems == []
        drop_connections(pg_url, tag)
        seen = await overview.overview(app)
        assert seen.problems == []
        assert [q.ready for q in seen.queues if q.queue == "polled"] == [1]
        assert checks  # the second tries were checked


async def test_metrics_give_no_cost_for_calls_to_a_model_without_a_price(client, pg_app):
    rt = await EvalRuntime.of(pg_app)
    await rt.store.record(batch="b", job_id=7, key="k1", kind="call", input_tokens=10, cost=None)
    got = samples((await client.get("/metrics")).text)
    assert got[("herd_eval_ledger_calls_total", (("kind", "call"),))] == 1
    # Unknown, never $0: no sample for the kind; kinds without calls still read 0.
    assert ("herd_eval_ledger_cost_dollars_total", (("kind", "call"),)) not in got
    assert got[("herd_eval_ledger_cost_dollars_total", (("kind", "lost"),))] == 0
