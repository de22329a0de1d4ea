"""The checker on hand-made outcomes: a clean one passes, each broken guarantee is named.

A chaos run that finds nothing only means something if the checker can fail:
each test below breaks one guarantee in the data a run leaves behind.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chaos.checker import Observed, evaluate
from chaos.pipeline import REDUCE_MODEL
from chaos.record import RunRecord
from herd.queue.base import Job, JobStatus

T0 = 1_000.0


def job(job_id: int, status: JobStatus, token: int, **kw: object) -> Job:
    now = datetime.now(UTC)
    fields: dict[str, object] = dict(
        id=job_id, task="chaos.work", queue="default", payload={}, status=status, priority=0,
        dedup_key=None, attempts=0, stalls=0, max_attempts=10, max_stalls=10, lease_seconds=3.0,
        lease_token=token, lease_owner=None, lease_expires_at=None, run_at=now, created_at=now,
        finished_at=now, result={"token": token} if status == JobStatus.SUCCEEDED else None,
        last_error=None, last_traceback=None, dead_reason=None, last_worker=None,
    )  # fmt: skip
    fields.update(kw)
    return Job(**fields)  # type: ignore[arg-type]


def scenario(tmp_path: Path) -> tuple[Observed, RunRecord, dict, Path]:
    """Job 1: worker 11 is SIGKILLed during its call, worker 12 finishes it (token 2).
    Job 2 (poison) is dead-lettered. Worker 12 stops with exit 0 at the drain."""
    side = [
        (11, {"t": T0, "event": "start", "job": 1, "token": 1, "pid": 11}),
        (12, {"t": T0 + 5, "event": "start", "job": 1, "token": 2, "pid": 12}),
        (12, {"t": T0 + 6, "event": "written", "job": 1, "token": 2, "pid": 12}),
        (12, {"t": T0 + 1, "event": "start", "job": 2, "token": 1, "pid": 12}),
    ]
    for pid, event in side:
        with (tmp_path / f"side-{pid}.jsonl").open("a") as fh:
            fh.write(json.dumps(event) + "\n")
    record = RunRecord(
        config={}, started=T0 - 1, ended=T0 + 20, job_ids={1: "work", 2: "poison"},
        faults=[{"t": T0 + 0.5, "kind": "kill", "pid": 11}], drain_exit_codes={12: 0},
    )  # fmt: skip
    sim = {
        "stats": {"calls": 2},
        "calls": {
            "tagged_calls": 2,
            "tags": {
                "1:1:11": [{"start": T0 + 0.2, "end": T0 + 0.5, "status": None}],
                "1:2:12": [{"start": T0 + 5.2, "end": T0 + 5.5, "status": 200}],
            },
        },
    }
    seen = Observed(
        "postgres",
        {1: job(1, JobStatus.SUCCEEDED, 2, stalls=1),
         2: job(2, JobStatus.DEAD, 2, task="chaos.poison", dead_reason="max_attempts")},
        results={1: 2},
        writes=[(1, 2)],
    )  # fmt: skip
    return seen, record, sim, tmp_path


def test_a_clean_outcome_passes_and_counts_the_cut_short_call(tmp_path):
    report = evaluate(*scenario(tmp_path))
    assert report.ok, report.text()
    assert report.figures["provider_calls_cut_short"] == 1
    assert report.figures["cut_short_by"] == {"kill": 1}
    assert "holds" in report.figures["calls_bound"]


def test_a_missing_or_unfinished_job_is_a_violation(tmp_path):
    seen, record, sim, d = scenario(tmp_path)
    del seen.jobs[2]
    seen.jobs[1] = job(1, JobStatus.PENDING, 2)
    text = " | ".join(evaluate(seen, record, sim, d).violations)
    assert "1 jobs missing" in text and "job 1 (work) never finished" in text


def test_a_result_from_a_stale_lease_is_a_violation(tmp_path):
    seen, record, sim, d = scenario(tmp_path)
    seen.jobs[1] = job(1, JobStatus.SUCCEEDED, 2, result={"token": 1})
    seen.results = {1: 1}
    text = " | ".join(evaluate(seen, record, sim, d).violations)
    assert "accepted result from token 1, final lease 2" in text
    assert "fenced result row has token 1" in text


def test_a_refused_write_that_landed_is_a_violation(tmp_path):
    seen, record, sim, d = scenario(tmp_path)
    with (d / "side-11.jsonl").open("a") as fh:
        fh.write(json.dumps({"t": T0 + 9, "event": "refused", "job": 1, "token": 1, "pid": 11}))
    seen.writes = [(1, 2), (1, 1)]
    report = evaluate(seen, record, sim, d)
    text = " | ".join(report.violations)
    assert "a refused write (token 1) landed" in text and "out of order" in text
    assert report.figures["fenced_writes_refused"] == 1


def test_a_call_no_fault_explains_is_a_violation(tmp_path):
    seen, record, sim, d = scenario(tmp_path)
    record.faults = []  # nobody killed worker 11: its call was simply wasted
    text = " | ".join(evaluate(seen, record, sim, d).violations)
    assert "1 provider calls wasted with no fault" in text and "BROKEN" not in text
    assert "provider calls 2 > succeeded jobs 1 + cut short 0" in text


def test_a_second_call_by_the_accepted_attempt_or_an_untagged_call_is_a_violation(tmp_path):
    seen, record, sim, d = scenario(tmp_path)
    sim["calls"]["tags"]["1:2:12"].append({"start": T0 + 5.6, "end": T0 + 5.8, "status": 200})
    sim["stats"]["calls"] = 4
    sim["calls"]["tagged_calls"] = 3
    text = " | ".join(evaluate(seen, record, sim, d).violations)
    assert "its accepted attempt made 2 calls" in text and "1 provider calls carry no" in text


def test_a_lease_of_a_dead_worker_or_a_stale_lease_key_is_a_violation(tmp_path):
    seen, record, sim, d = scenario(tmp_path)
    seen.backend = "redis"
    future = datetime.now(UTC) + timedelta(seconds=30)
    # pid 2**22 + 1 is above Linux's pid_max default: no such process.
    seen.jobs[3] = job(3, JobStatus.PROCESSING, 1, lease_owner="h:4194305:ab",
                       lease_expires_at=future)  # fmt: skip
    record.job_ids[3] = "work"
    seen.lease_keys = {1: "2"}
    text = " | ".join(evaluate(seen, record, sim, d).violations)
    assert "job 3: lease held by h:4194305:ab, no live worker" in text
    assert "lease key of job 1 (token 2) outlived its lease" in text


def test_workers_that_exit_by_themselves_or_badly_are_violations(tmp_path):
    seen, record, sim, d = scenario(tmp_path)
    record.unexpected_exits = [{"pid": 13, "code": 1}]
    record.drain_exit_codes = {12: 1}
    text = " | ".join(evaluate(seen, record, sim, d).violations)
    assert "worker 13 exited by itself (code 1)" in text
    assert "worker 12 exited 1 on the drain's SIGTERM" in text


def test_a_call_started_in_the_grace_period_of_a_sigterm_is_cut_short_by_it(tmp_path):
    seen, record, sim, d = scenario(tmp_path)
    # Worker 11 got SIGTERM before its call began; the grace period ran out mid-call.
    record.faults = [{"t": T0 + 0.1, "kind": "term", "pid": 11, "until": T0 + 1.1}]
    report = evaluate(seen, record, sim, d)
    assert report.ok, report.text()
    assert report.figures["cut_short_by"] == {"term": 1}
    # A SIGTERM that ended before the attempt began cannot explain its call.
    record.faults[0].update(t=T0 - 2.0, until=T0 - 1.5)
    assert not evaluate(seen, record, sim, d).ok


def test_a_call_a_stopped_worker_starts_on_resuming_is_cut_short_by_the_stop(tmp_path):
    seen, record, sim, d = scenario(tmp_path)
    # Worker 11 was frozen during its attempt; resumed, it began its call before its
    # heartbeat learned that the lease was gone.
    record.faults = [{"t": T0 + 0.05, "kind": "stop", "pid": 11, "until": T0 + 0.1}]
    sim["calls"]["tags"]["1:1:11"][0].update(start=T0 + 0.15, end=T0 + 0.2)
    report = evaluate(seen, record, sim, d)
    assert report.ok, report.text()
    assert report.figures["cut_short_by"] == {"stop": 1}


def test_a_lease_held_by_a_worker_dead_for_longer_than_a_lease_is_a_violation(tmp_path):
    seen, record, sim, d = scenario(tmp_path)
    record.config["lease"] = 3.0
    record.faults[0]["until"] = T0 + 0.5  # worker 11 died at T0 + 0.5
    record.lease_snapshot = [{"job": 1, "pid": 11, "alive": False, "t": T0 + 2.0}]
    assert evaluate(seen, record, sim, d).ok  # its lease may still run: fine
    record.lease_snapshot[0]["t"] = T0 + 10.0
    text = " | ".join(evaluate(seen, record, sim, d).violations)
    assert "lease held by dead worker 11 when the faults stopped, killed long before" in text
    record.lease_snapshot[0]["pid"] = 99
    assert "never killed" in " | ".join(evaluate(seen, record, sim, d).violations)


def test_stats_that_differ_from_a_full_count_are_a_violation(tmp_path):
    seen, record, sim, d = scenario(tmp_path)
    seen.counted = {("default", "succeeded"): 1, ("default", "dead"): 1}
    seen.stats = dict(seen.counted)
    assert evaluate(seen, record, sim, d).figures["stats_match_full_count"] is True
    seen.stats[("default", "succeeded")] = 2  # a counter that drifted
    report = evaluate(seen, record, sim, d)
    assert report.figures["stats_match_full_count"] is False
    assert any(v.startswith("stats() says") for v in report.violations), report.violations


def with_evaluations(tmp_path: Path) -> tuple[Observed, RunRecord, dict, Path]:
    """The scenario plus a batch of 3 documents on evaluation jobs 10 and 11 (two
    documents repeat: one job): job 10's first call was cut short by a kill, so the
    provider billed 3 calls, and the ledger holds call 2 + cut_short 1."""
    seen, record, sim, d = scenario(tmp_path)
    record.eval_batch, record.eval_documents = "chaos-1", 3
    record.eval_job_ids = {10: "k10", 11: "k11"}
    for i in (10, 11):
        seen.jobs[i] = job(i, JobStatus.SUCCEEDED, 1, task="herd.eval", queue="eval",
                           result={"source": "computed"})  # fmt: skip
    seen.ledger = {"call": 2, "cut_short": 1, "dedup": 1}
    seen.ledger_rows = dict(seen.ledger)
    seen.eval_items = {"done": 3}
    sim["eval"] = {"stats": {"calls": 3, "billed": 3, "disconnected": 1}}
    return seen, record, sim, d


def test_an_eval_ledger_equal_to_the_bill_passes_and_eval_jobs_are_not_chaos_jobs(tmp_path):
    report = evaluate(*with_evaluations(tmp_path))
    assert report.ok, report.text()
    assert report.figures["eval_calls_hit_by_faults"] == 1
    assert (
        "3 in the ledger, 3 billed (1 hung up): equal" in report.figures["eval_ledger_equals_bill"]
    )


def test_a_ledger_that_differs_from_the_bill_is_a_violation(tmp_path):
    seen, record, sim, d = with_evaluations(tmp_path)
    sim["eval"]["stats"]["billed"] = 4  # a call the ledger never saw
    text = " | ".join(evaluate(seen, record, sim, d).violations)
    assert "ledger != bill: 3 calls in the ledger (call 2, lost 0, failed 0, cut_short 1)" in text
    assert "4 billed by the provider" in text
    del sim["eval"]["stats"]["billed"]  # a simulator without the counter: its calls
    sim["eval"]["stats"]["calls"] = 1  # 3 in the ledger, 1 of them cut short: 2 over
    text = " | ".join(evaluate(seen, record, sim, d).violations)
    assert "1 billed by the provider" in text


def test_a_ledger_above_the_bill_only_by_calls_cut_off_mid_call_passes(tmp_path):
    seen, record, sim, d = with_evaluations(tmp_path)
    # One call closed "lost" (cancelled) that the provider never began generating, and
    # the scenario's cut_short call (its worker killed) that it did.
    seen.ledger["lost"] = seen.ledger_rows["lost"] = 1
    report = evaluate(seen, record, sim, d)
    assert report.ok, report.text()
    figure = report.figures["eval_ledger_equals_bill"]
    assert "4 in the ledger, 3 billed (1 hung up): equal but for 1 of the 2 calls" in figure
    sim["eval"]["stats"]["billed"] = 2  # the killed worker's call never arrived either
    assert evaluate(seen, record, sim, d).ok
    sim["eval"]["stats"]["billed"] = 1  # one more call above the bill than were cut off
    text = " | ".join(evaluate(seen, record, sim, d).violations)
    assert "ledger != bill: 4 calls in the ledger (call 2, lost 1, failed 0, cut_short 1)" in text


def test_open_calls_summary_drift_undone_documents_and_keys_called_twice_are_violations(
    tmp_path,
):
    seen, record, sim, d = with_evaluations(tmp_path)
    seen.ledger_open = 1
    seen.ledger_rows = {"call": 3}
    seen.eval_items = {"done": 2, "queued": 1}
    seen.keys_called_by_jobs = {"abcdef0123456789": 2}
    seen.jobs[11] = job(11, JobStatus.DEAD, 1, task="herd.eval", queue="eval",
                        dead_reason="max_stalls")  # fmt: skip
    text = " | ".join(evaluate(seen, record, sim, d).violations)
    assert "1 ledger calls were never closed" in text
    assert "the ledger's summary counts 3 calls, its rows 3" not in text
    assert "evaluations: 1 documents not done: {'queued': 1}" in text
    assert "key abcdef012345… has 'call' rows from 2 jobs" in text
    assert "evaluation job 11 ended dead: max_stalls" in text
    seen.ledger_rows = {"call": 2}
    text = " | ".join(evaluate(seen, record, sim, d).violations)
    assert "the ledger's summary counts 3 calls, its rows 2" in text


def with_pipeline(tmp_path: Path) -> tuple[Observed, RunRecord, dict, Path]:
    """The evaluations' scenario plus a batch in stages of two manuals, each with one
    reduce piece, answered; one reduce call was cut short by a kill and paid again."""
    seen, record, sim, d = with_evaluations(tmp_path)
    record.pipeline_batch, record.pipeline_documents = "chaos-pipe-1", 2
    seen.pipe_items = {"done": 2}
    seen.pipe_reduces = {"manual-000.md": (1, 1), "manual-001.md": (1, 1)}
    seen.pipe_reduce_ledger = {"call": 2, "cut_short": 1}
    seen.pipe_reduce_keys_paid = 2
    sim["eval"]["stats"]["by_model"] = {REDUCE_MODEL: 3}
    return seen, record, sim, d


def test_one_reduce_per_document_passes_with_a_reduce_cut_short_and_paid_again(tmp_path):
    report = evaluate(*with_pipeline(tmp_path))
    assert report.ok, report.text()
    assert report.figures["pipeline_documents"] == "2/2 answered, 2 with one reduce"
    assert report.figures["pipeline_reduce_calls"] == (
        "3 billed for 2 distinct inputs (1 cut short or lost)"
    )


def test_two_reduces_a_missing_answer_or_a_key_paid_twice_are_violations(tmp_path):
    seen, record, sim, d = with_pipeline(tmp_path)
    seen.pipe_reduces["manual-001.md"] = (2, 2)  # the fan-in ran twice
    seen.pipe_reduces["manual-002.md"] = (0, 0)  # never reduced
    seen.pipe_items = {"done": 2, "queued": 1}
    seen.pipe_keys_paid_twice = {"0123456789abcdef": 2}
    sim["eval"]["stats"]["by_model"][REDUCE_MODEL] = 4  # one call no fault explains
    text = " | ".join(evaluate(seen, record, sim, d).violations)
    assert "pipeline: 2 documents submitted, 3 items stored" in text
    assert "pipeline: 1 documents without a final answer: {'queued': 1}" in text
    assert "manual-001.md has 2 reduce pieces, 2 answered (not 1)" in text
    assert "manual-002.md has 0 reduce pieces, 0 answered (not 1)" in text
    assert "key 0123456789ab… paid 2 times (call or failed rows)" in text
    assert "billed 4 reduce calls for 2 distinct reduce inputs paid and 1 cut short" in text
