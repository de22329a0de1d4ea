"""Contract: enqueue, dedup keys, JSON-only payloads (every backend)."""

from __future__ import annotations

import pytest

from herd.errors import InvalidInput, NotJSONSerializable
from herd.queue.base import MAX_TRACE_CONTEXT_BYTES, Completion, JobStatus
from tests.helpers import job


async def test_enqueue_returns_ids_in_order_and_stores_payloads(broker):
    payloads = [{"n": i, "text": "ü\n", "nested": [1, None, True]} for i in range(5)]
    results = await broker.enqueue([job(payload=p) for p in payloads])
    assert [r.created for r in results] == [True] * 5
    assert len({r.job_id for r in results}) == 5
    for r, p in zip(results, payloads, strict=True):
        stored = await broker.get_job(r.job_id)
        assert stored.payload == p
        assert stored.status == JobStatus.PENDING


async def test_dedup_key_returns_the_active_job(broker):
    first = await broker.enqueue([job(dedup_key="doc-1")])
    again = await broker.enqueue([job(dedup_key="doc-1", payload={"other": 1})])
    assert first[0].created and not again[0].created
    assert again[0].job_id == first[0].job_id
    assert len(await broker.list_jobs()) == 1


async def test_dedup_key_within_one_batch(broker):
    results = await broker.enqueue(
        [job(dedup_key="a"), job(), job(dedup_key="a"), job(dedup_key="b")]
    )
    assert [r.created for r in results] == [True, True, False, True]
    assert results[0].job_id == results[2].job_id
    assert len(await broker.list_jobs()) == 3


async def test_dedup_key_is_free_again_once_the_job_finished(broker):
    (first,) = await broker.enqueue([job(dedup_key="k")])
    (lease,) = await broker.claim(["default"], "w1", 1)
    # Still active while processing.
    assert not (await broker.enqueue([job(dedup_key="k")]))[0].created
    assert await broker.complete_if_leased([Completion(lease, "done")]) == [True]
    (second,) = await broker.enqueue([job(dedup_key="k")])
    assert second.created and second.job_id != first.job_id


@pytest.mark.parametrize(
    "payload", [{"x": object()}, {"x": float("nan")}, {"x": "nul\x00byte"}, b"bytes"]
)
async def test_non_json_payload_is_refused_and_nothing_is_enqueued(broker, payload):
    with pytest.raises(NotJSONSerializable):
        await broker.enqueue([job(payload={"fine": 1}), job(payload=payload)])
    assert await broker.list_jobs() == []


async def test_dedup_keys_are_scoped_to_their_queue(broker):
    a, b = await broker.enqueue([job(queue="q1", dedup_key="k"), job(queue="q2", dedup_key="k")])
    assert a.created and b.created and a.job_id != b.job_id


async def test_trace_context_round_trips_to_the_job_and_its_lease(broker):
    carrier = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "tracestate": "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
    }
    traced, plain = await broker.enqueue([job(trace_context=carrier), job()])
    assert (await broker.get_job(traced.job_id)).trace_context == carrier
    assert (await broker.get_job(plain.job_id)).trace_context is None
    leases = {lease.job_id: lease for lease in await broker.claim(["default"], "w1", 2)}
    assert leases[traced.job_id].trace_context == carrier
    assert leases[plain.job_id].trace_context is None


@pytest.mark.parametrize(
    "carrier", [{"traceparent": "x" * (MAX_TRACE_CONTEXT_BYTES + 1)}, {"traceparent": 1}]
)
async def test_a_bad_trace_context_is_refused_and_nothing_is_enqueued(broker, carrier):
    with pytest.raises(InvalidInput) as refused:
        await broker.enqueue([job(), job(trace_context=carrier)])
    assert refused.value.field == "trace_context"
    assert await broker.list_jobs() == []
