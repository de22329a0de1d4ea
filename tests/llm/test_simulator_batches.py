"""The simulator's Batch APIs, driven by the official ``openai`` and ``anthropic`` SDKs:
what those clients parse is what the simulator answers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import anthropic
import httpx
import openai
import pytest

from herd.limits.base import key_id
from herd.testing.simulator import SimConfig, Simulator, batches
from herd.testing.simulator.__main__ import build_parser, config_from
from tests.llm.conftest import Sim

T = TypeVar("T")
SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["yes", "no"]},
        "score": {"type": "integer"},
    },
    "required": ["label", "score"],
    "additionalProperties": False,
}


def until(get: Callable[[], T], done: Callable[[T], bool], timeout: float = 5.0) -> T:
    """Poll ``get`` until ``done`` holds of its value, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"never reached: {value}"
        time.sleep(0.02)


def oai(sim: Sim) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.openai_url, api_key="sk-any", max_retries=0)


def ant(sim: Sim) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=sim.url, api_key="sk-any", max_retries=0)


def chat_body(i: int) -> dict[str, Any]:
    return {
        "model": "gpt-sim",
        "messages": [{"role": "user", "content": f"item {i}"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": SCHEMA}},
    }


def message_params(i: int) -> dict[str, Any]:
    return {
        "model": "claude-sim",
        "max_tokens": 64,
        "system": "judge",
        "messages": [{"role": "user", "content": f"item {i}"}],
    }


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "\n".join(json.dumps(x) for x in lines).encode()


def upload(client: openai.OpenAI, n: int, first: int = 0) -> str:
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": chat_body(i),
        }
        for i in range(first, first + n)
    ]
    return client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch").id


def openai_batch(client: openai.OpenAI, n: int, **metadata: str) -> openai.types.Batch:
    return client.batches.create(
        input_file_id=upload(client, n),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata=metadata or None,
    )


def ended_openai(client: openai.OpenAI, batch_id: str) -> openai.types.Batch:
    ended = ("completed", "failed", "expired", "cancelled")
    return until(lambda: client.batches.retrieve(batch_id), lambda b: b.status in ended)


def ended_anthropic(client: anthropic.Anthropic, batch_id: str) -> Any:
    return until(
        lambda: client.messages.batches.retrieve(batch_id), lambda b: b.processing_status == "ended"
    )


def test_openai_batch_answers_as_the_sync_endpoint_and_bills_apart(sim: Sim) -> None:
    sim.configure(batch_latency=0.05)
    client = oai(sim)
    created = openai_batch(client, 3, job="j-1")
    assert created.status == "validating" and created.request_counts.total == 3
    assert created.metadata == {"job": "j-1"}
    done = ended_openai(client, created.id)
    assert done.status == "completed" and done.completed_at and done.error_file_id is None
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    lines = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == ["req-0", "req-1", "req-2"]
    line = next(x for x in lines if x["custom_id"] == "req-1")
    assert line["id"].startswith("batch_req_") and line["error"] is None
    assert line["response"]["status_code"] == 200
    sync = client.chat.completions.create(**chat_body(1))
    body = line["response"]["body"]
    assert body["choices"][0]["message"]["content"] == sync.choices[0].message.content
    assert body["usage"] == sync.usage.model_dump(exclude_none=True)
    assert done.usage is not None and done.usage.total_tokens > 0
    stats = sim.stats()
    assert stats["batches"]["created"] == 1 and stats["batch_billed"] == 3
    assert stats["billed"] == 1  # the synchronous call only
    assert stats["batches"]["by_status"]["openai"] == {"completed": 1}
    output = client.files.retrieve(done.output_file_id)
    assert output.purpose == "batch_output" and output.bytes > 0


def test_anthropic_batch_answers_as_the_sync_endpoint(sim: Sim) -> None:
    sim.configure(batch_latency=0.05)
    client = ant(sim)
    requests: Any = [{"custom_id": f"c-{i}", "params": message_params(i)} for i in range(2)]
    created = client.messages.batches.create(requests=requests)
    assert created.processing_status == "in_progress" and created.results_url is None
    assert created.request_counts.processing == 2
    done = ended_anthropic(client, created.id)
    assert done.request_counts.succeeded == 2 and done.request_counts.processing == 0
    assert done.ended_at is not None and done.results_url
    results = {r.custom_id: r.result for r in client.messages.batches.results(created.id)}
    assert set(results) == {"c-0", "c-1"}
    result = results["c-0"]
    assert result.type == "succeeded"
    sync = client.messages.create(**message_params(0))
    assert result.message.content[0].text == sync.content[0].text  # type: ignore[union-attr]
    assert result.message.usage.input_tokens == sync.usage.input_tokens
    assert result.message.usage.output_tokens == sync.usage.output_tokens
    stats = sim.stats()
    assert stats["batches"]["created_by_api"] == {"openai": 0, "anthropic": 1}
    assert stats["batch_billed"] == 2 and stats["billed"] == 1


def test_a_keys_files_and_batches_are_its_own(sim: Sim) -> None:
    """As a provider keeps them in the project or workspace of the key that made them:
    another key neither lists nor reaches them, and the stats count batches per key."""
    mine, theirs = oai(sim), openai.OpenAI(base_url=sim.openai_url, api_key="sk-other",
                                           max_retries=0)  # fmt: skip
    made = openai_batch(mine, 2)
    with pytest.raises(openai.NotFoundError):
        theirs.batches.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        theirs.files.content(made.input_file_id)
    assert made.id not in {b.id for b in theirs.batches.list()}
    assert mine.batches.retrieve(made.id).id == made.id
    a, b = ant(sim), anthropic.Anthropic(base_url=sim.url, api_key="sk-other", max_retries=0)
    sent = a.messages.batches.create(
        requests=[{"custom_id": "r0", "params": message_params(0)}]  # type: ignore[list-item]
    )
    with pytest.raises(anthropic.NotFoundError):
        b.messages.batches.retrieve(sent.id)
    assert sim.stats()["batches"]["created_by_key"] == {key_id("sk-any"): 2}


def test_openai_lists_batches_newest_first_with_metadata_and_pages(sim: Sim) -> None:
    sim.configure(batch_latency=0.05)
    client = oai(sim)
    ids = [openai_batch(client, 1, handle=f"h{i}").id for i in range(3)]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more
    assert [b.metadata for b in first.data] == [{"handle": "h2"}, {"handle": "h1"}]
    rest = client.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in rest.data] == [ids[0]] and not rest.has_more
    assert [b.id for b in client.batches.list(limit=1)] == ids[::-1]  # the SDK pages on
    files = client.files.list(purpose="batch")
    assert len(files.data) == 3 and {f.purpose for f in files.data} == {"batch"}
    gone = client.files.delete(files.data[0].id)
    assert gone.deleted and len(client.files.list(purpose="batch").data) == 2


def test_anthropic_lists_with_after_and_before(sim: Sim) -> None:
    sim.configure(batch_latency=0.05)
    client = ant(sim)
    ids = [
        client.messages.batches.create(
            requests=[{"custom_id": "a", "params": message_params(i)}]  # type: ignore[list-item]
        ).id
        for i in range(3)
    ]
    newest = ids[::-1]
    page = client.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == newest[:2] and page.has_more
    assert page.last_id == newest[1]
    after = client.messages.batches.list(limit=2, after_id=newest[1])
    assert [b.id for b in after.data] == [newest[2]] and not after.has_more
    before = client.messages.batches.list(limit=5, before_id=newest[2])
    assert [b.id for b in before.data] == newest[:2]
    assert [b.id for b in client.messages.batches.list(limit=1)] == newest


def test_cancel_both(sim: Sim) -> None:
    sim.configure(batch_latency=1.0)
    o, a = oai(sim), ant(sim)
    ob = openai_batch(o, 2)
    ab = a.messages.batches.create(
        requests=[{"custom_id": f"c{i}", "params": message_params(i)} for i in range(2)]  # type: ignore[misc]
    )
    cancelling = o.batches.cancel(ob.id)
    canceling = a.messages.batches.cancel(ab.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at
    done = ended_openai(o, ob.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    ended = ended_anthropic(a, ab.id)
    assert ended.request_counts.canceled + ended.request_counts.succeeded == 2
    types = {r.result.type for r in a.messages.batches.results(ab.id)}
    assert "canceled" in types
    with pytest.raises(openai.APIStatusError):
        o.batches.cancel(ob.id)  # an ended batch cannot be cancelled again


def test_expire_both(sim: Sim) -> None:
    sim.configure(batch_latency=0.05, batch_expire=True)
    o, a = oai(sim), ant(sim)
    ob = openai_batch(o, 2)
    ab = a.messages.batches.create(requests=[{"custom_id": "e", "params": message_params(0)}])  # type: ignore[list-item]
    done = ended_openai(o, ob.id)
    assert done.status == "expired" and done.expired_at is not None and done.output_file_id is None
    errors = [json.loads(x) for x in o.files.content(done.error_file_id).text.splitlines()]
    assert {e["custom_id"] for e in errors} == {"req-0", "req-1"}
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    ended = ended_anthropic(a, ab.id)
    assert ended.request_counts.expired == 1
    assert [r.result.type for r in a.messages.batches.results(ab.id)] == ["expired"]
    assert sim.stats()["batch_billed"] == 0


def test_drawn_failures_mark_lines_errored(sim: Sim) -> None:
    sim.configure(batch_latency=0.05, fail_rates={"500": 1.0})
    o, a = oai(sim), ant(sim)
    done = ended_openai(o, openai_batch(o, 2).id)
    assert done.status == "completed" and done.output_file_id is None
    assert (done.request_counts.completed, done.request_counts.failed) == (0, 2)
    errors = [json.loads(x) for x in o.files.content(done.error_file_id).text.splitlines()]
    assert {e["response"]["status_code"] for e in errors} == {500}
    ab = a.messages.batches.create(requests=[{"custom_id": "f", "params": message_params(0)}])  # type: ignore[list-item]
    assert ended_anthropic(a, ab.id).request_counts.errored == 1
    (result,) = a.messages.batches.results(ab.id)
    assert result.result.type == "errored" and result.result.error.error.type == "api_error"  # type: ignore[union-attr]
    assert sim.stats()["batch_billed"] == 0


def test_bad_input_is_refused_in_the_providers_error_shapes(sim: Sim) -> None:
    o, a = oai(sim), ant(sim)
    line = {"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(0)}
    cases = [
        ([line, line], "duplicated"),
        ([{**line, "url": "/v1/embeddings"}], "url must be one of"),
        (
            [{**line, "custom_id": f"x{i}"} for i in range(batches.OPENAI_MAX_REQUESTS + 1)],
            "over 50000",
        ),
    ]
    for lines, words in cases:
        with pytest.raises(openai.BadRequestError) as err:
            o.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        assert words in err.value.message and err.value.param == "file"
    file_id = o.files.create(file=("in.jsonl", jsonl([line])), purpose="batch").id
    with pytest.raises(openai.BadRequestError) as err:
        o.batches.create(
            input_file_id=file_id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"k" * 65: "v"},
        )
    assert err.value.param == "metadata"
    with pytest.raises(openai.BadRequestError) as err:
        o.batches.create(input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h")
    assert err.value.param == "endpoint"
    other = {**line, "custom_id": "y", "body": {**chat_body(1), "model": "gpt-other"}}
    mixed = o.files.create(file=("in.jsonl", jsonl([line, other])), purpose="batch").id
    failed = ended_openai(
        o,
        o.batches.create(
            input_file_id=mixed, endpoint="/v1/chat/completions", completion_window="24h"
        ).id,
    )
    assert failed.status == "failed" and failed.failed_at is not None and failed.errors
    assert [e.code for e in failed.errors.data or []] == ["mismatched_model"]
    with pytest.raises(openai.NotFoundError):
        o.batches.retrieve("batch_missing")
    with pytest.raises(openai.NotFoundError):
        o.files.content("file-missing")
    params: Any = message_params(0)
    for requests, words in [
        ([{"custom_id": "a", "params": params}] * 2, "more than once"),
        ([{"custom_id": "has space", "params": params}], "custom_id"),
        ([], "non-empty"),
    ]:
        with pytest.raises(anthropic.BadRequestError) as aerr:
            a.messages.batches.create(requests=requests)
        body: Any = aerr.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert words in body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        a.messages.batches.retrieve("msgbatch_missing")
    raw = httpx.get(sim.url + "/v1/messages/batches", headers={"x-api-key": "k"})
    assert raw.status_code == 400 and "anthropic-version" in raw.text
    assert sim.stats()["batches"]["created"] == 1  # the failed one
    assert sim.stats()["batch_billed"] == 0


def test_state_is_bounded_and_reset_clears_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batches, "MAX_BATCHES", 3)
    sim = Simulator(SimConfig(batch_latency=0.0)).start()
    try:
        client = anthropic.Anthropic(base_url=sim.url, api_key="k", max_retries=0)
        ids = [
            client.messages.batches.create(
                requests=[{"custom_id": "a", "params": message_params(i)}]  # type: ignore[list-item]
            ).id
            for i in range(5)
        ]
        kept = [b.id for b in client.messages.batches.list()]
        assert kept == ids[::-1][:3]  # the oldest ended ones were dropped
        stats = httpx.get(sim.url + "/_sim/stats").json()
        assert stats["batches"]["created"] == 5
        httpx.post(sim.url + "/_sim/reset").raise_for_status()
        assert list(client.messages.batches.list()) == []
        assert httpx.get(sim.url + "/_sim/stats").json()["batches"]["created"] == 0
    finally:
        sim.close()


def test_batch_flags() -> None:
    config = config_from(build_parser().parse_args(["--batch-latency", "0.5", "--batch-expire"]))
    assert config.batch_latency == 0.5 and config.batch_expire
    assert config_from(build_parser().parse_args([])).batch_latency == 1.0


def test_result_faults_go_into_both_apis_results(sim: Sim) -> None:
    with pytest.raises(AssertionError, match="batch_result_faults"):
        sim.configure(batch_result_faults=["no_such_fault"])
    faults = ["empty_id", "unknown_id", "duplicate", "not_json", "not_object"]
    sim.configure(batch_latency=0.05, batch_result_faults=faults)
    o = oai(sim)
    done = ended_openai(o, openai_batch(o, 2).id)
    raw = o.files.content(done.output_file_id).text.splitlines()
    with pytest.raises(ValueError):
        json.loads(raw[-1])  # not JSON
    lines = [json.loads(x) for x in raw[:-1]]
    assert [x["custom_id"] for x in lines] == ["req-0", "re", "req-0", ""]
    assert lines[0]["response"] == "oops" and lines[2]["response"]["status_code"] == 200
    headers = {"x-api-key": "sk-any", "anthropic-version": "2023-06-01"}
    a = ant(sim)
    ab = a.messages.batches.create(
        requests=[{"custom_id": f"a-{i}", "params": message_params(i)} for i in range(2)]  # type: ignore[misc]
    )
    ended_anthropic(a, ab.id)
    raw = sim.http.get(f"/v1/messages/batches/{ab.id}/results", headers=headers).text.splitlines()
    lines = [json.loads(x) for x in raw[:-1]]
    assert [x["custom_id"] for x in lines] == ["a-0", "a", "a-0", ""]
    assert lines[0]["result"] == "oops" and lines[2]["result"]["type"] == "succeeded"
