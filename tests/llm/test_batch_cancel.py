"""`herd eval cancel` and the one retry of what a provider batch failed
(HERD_EVAL_BATCH_RETRY), against the simulator."""

from __future__ import annotations

import asyncio

import pytest

from herd import App, Worker
from herd.errors import BatchNotFound, InvalidInput
from herd.llm import eval as evaluate
from herd.llm.eval import cancel, submit
from tests.helpers import eventually, priced
from tests.llm.test_batch_api import ANTH_SPEC, SPEC, calls, docs, items
from tests.llm.test_batch_api import anthropic_env as anthropic_env  # noqa: F401
from tests.llm.test_batch_api import app as app  # noqa: F401 - the fixture


async def statuses(app: App) -> dict[str, int]:
    out: dict[str, int] = {}
    for s, _ in await items(app):
        out[s] = out.get(s, 0) + 1
    return out


async def provider_rows(app: App) -> list[tuple[str, str | None, str | None]]:
    rt = await evaluate.EvalRuntime.of(app)
    rows = await rt.store.execute(
        "SELECT state, status, provider_batch_id FROM herd_eval_provider_batches ORDER BY handle"
    )
    return [(a, b, c) for a, b, c in rows]


async def idle(app: App) -> bool:
    return not any(j.status in ("pending", "processing") for j in await app.list_jobs())


def stats_show(sim, check):
    """A probe for ``eventually``: the simulator's stats satisfy ``check``."""

    async def probe() -> bool:
        return bool(check(await asyncio.to_thread(sim.stats)))

    return probe


def items_are(app: App, expected: dict[str, int]):
    async def probe() -> bool:
        return await statuses(app) == expected

    return probe


class Running:
    """A worker in this process, for as long as the block lasts."""

    def __init__(self, app: App) -> None:
        self.worker = Worker(app, queues=[evaluate.QUEUE], concurrency=4, poll_interval=0.05,
                             install_signal_handlers=False)  # fmt: skip

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(self.worker.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.worker.stop()
        await self.task


async def test_a_cancelled_batch_makes_no_call_and_takes_no_more_documents(
    app, sim, tmp_path, monkeypatch
):
    priced(monkeypatch, tmp_path, SPEC.model)
    report = await submit(app, [docs(tmp_path, 6)], SPEC, batch="c", budget=10.0)
    assert report.queued == 6
    found = await cancel(app, "c")
    assert found["cancelled_items"] == 6 and found["provider_batches"] == []
    async with Running(app):
        await eventually(lambda: idle(app), timeout=20, interval=0.1)
    assert sim.stats()["billed"] == 0 and await calls(app) == 0
    assert await statuses(app) == {"cancelled": 6}
    status = (await evaluate.batch_status(app, "c")).to_json()
    assert (status["cancelled_items"], status["parked"], status["done"]) == (6, "cancelled", 0)
    # Raising the budget does not bring a cancelled batch back, nor does a new submission.
    assert (await evaluate.set_budget(app, "c", 20.0))["resumed"] == 0
    with pytest.raises(InvalidInput, match="cancelled"):
        await submit(app, [docs(tmp_path, 1)], SPEC, batch="c")
    with pytest.raises(BatchNotFound):
        await cancel(app, "no-such-batch")


async def test_a_batch_cancelled_before_its_submission_ran_creates_no_provider_batch(
    app, sim, tmp_path
):
    await submit(app, [docs(tmp_path, 4)], SPEC, batch="early", batch_api=True)
    assert (await cancel(app, "early"))["cancelled_items"] == 4
    async with Running(app):
        await eventually(lambda: idle(app), timeout=20, interval=0.1)
    stats = sim.stats()
    assert stats["batches"]["created"] == 0 and stats["billed"] == 0
    assert await provider_rows(app) == [("done", "cancelled", None)]
    assert await statuses(app) == {"cancelled": 4}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_cancel_stops_the_provider_batch_and_files_what_it_answered(
    app, sim, tmp_path, anthropic_env, provider
):
    # Answers spread over 6 s: a cancel after the first leaves the rest unanswered.
    sim.configure(batch_latency=6.0)
    spec = SPEC if provider == "openai" else ANTH_SPEC
    await submit(app, [docs(tmp_path, 8)], spec, batch="mid", batch_api=True)
    async with Running(app):
        await eventually(stats_show(sim, lambda s: s["batch_billed"] >= 1), timeout=20)
        found = await cancel(app, "mid")
        assert len(found["provider_batches"]) == 1 and found["provider_cancel_failed"] == []
        await eventually(lambda: idle(app), timeout=30, interval=0.1)
    stats = sim.stats()
    assert stats["batches"]["created"] == 1
    ended = {"openai": "cancelled", "anthropic": "ended"}[provider]
    assert stats["batches"]["by_status"][provider] == {ended: 1}, stats["batches"]
    answered = stats["batch_billed"]
    assert 1 <= answered < 8  # it stopped part way
    # What the provider answered before it stopped is paid for: filed, not retried.
    assert await calls(app) == answered and stats["billed"] == 0
    assert await statuses(app) == {"done": answered, "cancelled": 8 - answered}
    ((state, status, _),) = await provider_rows(app)
    assert (state, status) == ("done", ended)


async def test_the_cli_cancels_a_batch(app, sim, tmp_path, pg_url):
    from tests.test_cli import herd

    await submit(app, [docs(tmp_path, 2)], SPEC, batch="cli")
    r = await asyncio.to_thread(herd, "eval", "cancel", "nope", url=pg_url)
    assert r.returncode == 1 and "nope" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = await asyncio.to_thread(herd, "eval", "cancel", "cli", url=pg_url)
    assert r.returncode == 0, r.stderr
    assert "2 items cancelled" in r.stdout


async def test_the_http_api_cancels_a_batch(app, sim, tmp_path):
    from tests.api.conftest import client_of

    await submit(app, [docs(tmp_path, 3)], SPEC, batch="web")
    async with client_of(app) as c:
        r = await c.post("/evals/nope/cancel")
        assert r.status_code == 404, r.text
        r = await c.post("/evals/web/cancel")
        assert r.status_code == 200, r.text
        assert r.json()["cancelled_items"] == 3
        r = await c.get("/evals/web")
        assert r.json()["cancelled_items"] == 3 and r.json()["parked"] == "cancelled"


@pytest.fixture
def batch_retry(monkeypatch):
    monkeypatch.setenv("HERD_EVAL_BATCH_RETRY", "batch")


async def test_with_batch_retry_an_expired_request_goes_into_a_new_provider_batch(
    batch_retry, app, sim, tmp_path
):
    assert app.settings.eval_batch_retry == "batch"
    sim.configure(batch_expire=True)  # taken when a batch is created: only the first
    await submit(app, [docs(tmp_path, 3)], SPEC, batch="r", batch_api=True)
    async with Running(app):
        await eventually(stats_show(sim, lambda s: s["batches"]["created"] >= 1), timeout=20)
        sim.configure(batch_expire=False)
        await eventually(items_are(app, {"done": 3}), timeout=30, interval=0.1)
    stats = sim.stats()
    assert stats["batches"]["created"] == 2 and stats["billed"] == 0  # no synchronous call
    assert stats["batch_billed"] == 3 == await calls(app)
    assert {src for _, src in await items(app)} == {"batch"}
    assert [s for _, s, _ in await provider_rows(app)] == ["expired", "completed"]


async def test_with_batch_retry_a_second_failure_is_dead_lettered_with_the_providers_error(
    batch_retry, app, sim, tmp_path
):
    sim.configure(batch_expire=True)
    await submit(app, [docs(tmp_path, 2)], SPEC, batch="d", batch_api=True)
    async with Running(app):
        await eventually(lambda: _dead(app, 2), timeout=30, interval=0.1)
        dead = await app.dead_letters()
        assert all("expired" in (j.last_error or "") for j in dead), [j.last_error for j in dead]
        assert sim.stats()["batches"]["created"] == 2 and sim.stats()["billed"] == 0
        assert ((await evaluate.batch_status(app, "d")).to_json())["failed"] == 2
        # Requeued by hand, it goes once through the synchronous path.
        await app.requeue([dead[0].id])
        await eventually(stats_show(sim, lambda s: s["billed"] == 1), timeout=20)
        # The other stays failed: its job is still dead-lettered.
        await eventually(items_are(app, {"done": 1, "queued": 1}), timeout=20)


async def _dead(app: App, n: int) -> bool:
    return len(await app.dead_letters()) == n


async def test_a_later_submission_joins_the_keys_already_in_a_provider_batch(app, sim, tmp_path):
    # Long enough that the first provider batch is still running when the second
    # submission looks, however loaded the machine: with 3 s, a run in CI looked after
    # it had been answered and cached, and the keys went the cached way (5 queued).
    sim.configure(batch_latency=10.0)
    folder = docs(tmp_path, 4)
    await submit(app, [folder], SPEC, batch="w1", batch_api=True)
    async with Running(app):
        await eventually(stats_show(sim, lambda s: s["batches"]["created"] == 1), timeout=20)
        (folder / "new.txt").write_text("A fifth paper.\n")
        second = await submit(app, [folder], SPEC, batch="w2", batch_api=True)
        assert (second.queued, second.deduplicated) == (1, 4)
        await eventually(items_are(app, {"done": 9}), timeout=45, interval=0.1)
    stats = sim.stats()
    # The four keys in flight were not sent again: the second batch carries one request.
    assert stats["batches"]["created"] == 2 and stats["batch_billed"] == 5
    assert stats["billed"] == 0
    status = (await evaluate.batch_status(app, "w2")).to_json()
    assert status["done"] == 5 and status["documents"] == 5
