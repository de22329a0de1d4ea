"""CI-sized chaos runs, one per backend: real workers, real servers, real faults.

Each run: 3 worker processes, 150 jobs of random length that each call the
provider simulator, 36 evaluation documents (some repeated) and 8 manuals in stages
(split, map, reduce) against a simulator of their own, 3 s leases, and on a schedule
2 SIGKILLs, 2 SIGSTOPs past the lease, a SIGTERM, a restart of the job store and a
drop of every client connection. The
checker must find no violation (the evaluations' ledger equals their simulator's
bill among them), and the faults must have bitten (leases taken over, evaluation
calls cut short or lost), so that an injection that silently does nothing fails.
"""

from __future__ import annotations

import os

import pytest

from chaos.harness import ChaosConfig, run_chaos

JOBS = 150
PIPELINE_DOCS = 8


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["postgres", "redis", "redis-cluster"])
async def test_a_chaos_run_breaks_no_guarantee(backend: str, tmp_path) -> None:
    config = ChaosConfig(
        backend=backend,
        workers=3,
        concurrency=3,
        jobs=JOBS,
        lease=3.0,
        fault_phase=24.0,
        faults={"kill": 2, "stop": 2, "term": 1, "restart": 1, "drop": 1},
        seed=8,
        # A batch in stages too (chaos/pipeline.py): split, a note per section, one
        # summary per manual, on the evaluations' simulator while the faults land.
        pipeline_docs=PIPELINE_DOCS,
        pipeline_sections=(3, 8),
        run_dir=tmp_path / "run",
        # A database of its own on the chaos server, named after the suite's.
        database=f"{os.environ.get('HERD_TEST_DB', 'herd_test')}_chaos",
    )
    report = await run_chaos(config)
    print(report.text())
    assert report.ok, report.text()

    f = report.figures
    faults = f["faults_injected"]
    assert faults.get("kill", 0) >= 1 and faults.get("stop", 0) >= 1, faults
    assert faults.get("term", 0) >= 1, faults
    assert faults.get(f"{backend}_restart") == 1 and faults.get(f"{backend}_drop") == 1, faults
    # The faults bit: leases of killed or frozen workers were taken over (or refused).
    assert f["leases_taken_over"] + f["fenced_writes_refused"] > 0, f
    assert sum(f["outcome"].values()) == JOBS
    assert f["outcome"].get("dead", 0) == round(JOBS * config.poison_share)
    assert f["provider_calls"] >= f["outcome"]["succeeded"]
    # The counts kept as jobs changed (triggers, scripts) survived kills and restarts.
    assert f["stats_match_full_count"] is True
    # The evaluations: all done, the ledger equal to the bill, and faults landed mid-call.
    assert f["eval_documents"].startswith(f"{config.eval_docs}/{config.eval_docs} done"), f
    assert "equal" in f["eval_ledger_equals_bill"], f  # or "equal but for" calls cut off
    assert f["eval_calls_hit_by_faults"] >= 1, f
    # One reduce per document (guarantee 9): every manual answered by exactly one.
    expected = f"{PIPELINE_DOCS}/{PIPELINE_DOCS} answered, {PIPELINE_DOCS} with one reduce"
    assert f["pipeline_documents"] == expected, f
    assert f["pipeline_keys_paid_twice"] == 0, f
