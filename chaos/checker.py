"""The invariant checker: read what a chaos run left behind and name every broken guarantee.

Sources: the job store (through herd's own broker API), the fenced result tables
(PostgreSQL), the lease keys (Redis), the workers' unfenced side logs and stderr
logs, the harness's record of the faults it injected, and the simulator's record
of every provider call, tagged ``job:token:pid`` by the task that made it.

Guarantees checked (each failure is a violation; the run fails on any):
  1. no job is missing, and every job ended: succeeded, or dead-lettered with a reason;
     poison jobs (always failing) are dead, never succeeded;
  2. exactly one accepted result per succeeded job, from its final lease: the stored
     result carries the job's final fencing token; on PostgreSQL the fenced result
     row carries it too, the fenced writes of a job landed in increasing token order,
     and no write that the side log shows refused (LeaseLost) is in the table;
  3. provider calls <= succeeded jobs + calls cut short by a fault: the accepted
     attempt of each succeeded job made exactly one call, and every other call
     belongs to an attempt that a fault hit during its life, from its start to the
     job's next attempt (its worker killed, stopped or terminated, or the job store
     restarted or its connections dropped); no call is unattributed;
  4. every lease held when the faults stop belongs to a live worker, or to one that
     died less than a lease ago (its lease runs out by itself), and every lease
     still held at the end belongs to a live worker (Redis: no lease key outlives
     its job's lease);
  5. workers exit only when told to, and exit 0 on the drain's SIGTERM;
  6. stats() (counts kept by triggers or scripts as jobs change) equals a full count
     of the store (PostgreSQL: GROUP BY over herd_jobs; Redis: a scan of job hashes);
  7. the evaluations' cost ledger equals the provider's bill: its calls that reached
     the provider (call + lost + failed + cut_short, in the summary, which equals the
     rows) are the calls the evaluations' own simulator billed, never fewer, and more
     only by calls closed ``cut_short`` or ``lost`` (cut off mid-call: whether the
     provider saw the request nobody can tell, so the ledger counts it); no call is
     left open; every document is done and every evaluation job succeeded; no key has
     'call' rows from two jobs (a repeated document is deduplicated or cached).
  8. (network runs) a worker cut off from the job store (both ways, its answers only, or
     with every other worker) ends the model calls it has running once its local lease
     deadline passes: every call of a cut-off worker that overlaps a cut lasting past
     the lease has ended (cancelled or answered) by the cut's start + the lease + a
     heartbeat tick + 1 s; and nothing it writes after the cut heals is accepted from a
     lease it lost: no fenced write of a cut-off worker landing after the heal comes
     after a newer attempt of its job began.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chaos.backends import PostgresBackend, RedisBackend, alive, pid_of_owner
from chaos.pipeline import REDUCE_MODEL, REDUCE_STAGE
from chaos.record import RunRecord
from herd.llm.eval.ledger import PAID
from herd.queue.base import Broker, Job, JobStatus

# A connection cut by a restart or a drop is found dead at its next use, which can
# come a while later (an idle pooled connection): such faults explain the attempts
# that were running or began up to this many seconds after them.
GLOBAL_FAULT_REACH = 10.0
_LOST = re.compile(r"job (\d+): lease lost \(([^)]*)\)")
PID_FAULTS = ("kill", "stop", "term")
NET_FAULTS = ("cut", "oneway", "slow", "isolate")  # chaos/netns.py: {hosts, pids, t, until}


@dataclass
class Report:
    backend: str
    figures: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    run_dir: str = ""

    @property
    def ok(self) -> bool:
        return not self.violations

    def violation(self, text: str) -> None:
        self.violations.append(text)

    def text(self) -> str:
        f = self.figures
        lines = [f"chaos run on {self.backend} ({self.run_dir})"]
        for key, value in f.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
            lines.append(f"  {key.replace('_', ' ')}: {value}")
        if self.violations:
            lines.append(f"VIOLATIONS ({len(self.violations)}):")
            lines += [f"  - {v}" for v in self.violations[:50]]
            if len(self.violations) > 50:
                lines.append(f"  … and {len(self.violations) - 50} more")
        else:
            lines.append("no violation")
        return "\n".join(lines)


def _read_jsonl(paths: list[Path]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by SIGKILL mid-write: nothing to learn from it
    return out


async def _jobs(broker: Broker, expected: int) -> dict[int, Job]:
    jobs: dict[int, Job] = {}
    for status in JobStatus:
        for job in await broker.list_jobs(status=status, limit=expected + 1000):
            jobs[job.id] = job
    return jobs


def _fault_windows(record: RunRecord) -> list[tuple[str, int | None, float, float]]:
    """(kind, pid or None for the job store, start, end) of every fault injected."""
    windows = []
    for f in record.faults:
        kind = f["kind"]
        if kind in PID_FAULTS:
            windows.append((kind, f["pid"], f["t"], float(f.get("until") or f["t"])))
        elif kind.endswith(("_restart", "_drop")):
            windows.append((kind, None, f["t"], float(f.get("until") or f["t"])))
        elif kind in NET_FAULTS:  # a partition hits the workers on the hosts it cut off
            for pid in f["pids"]:
                windows.append((kind, pid, f["t"], float(f.get("until") or f["t"])))
    # A worker's own fault is the first explanation looked for, the job store's after.
    return sorted(windows, key=lambda w: w[1] is None)


@dataclass
class Observed:
    """What the job store holds after the run (read once, then judged)."""

    backend: str
    jobs: dict[int, Job]
    results: dict[int, int] = field(default_factory=dict)  # PostgreSQL: job -> fenced row token
    writes: list[tuple[int, int]] = field(default_factory=list)  # (job, token) in commit order
    # PostgreSQL: every fenced write as (job, token, pid, commit time, epoch seconds)
    writes_by: list[tuple[int, int, int, float]] = field(default_factory=list)
    lease_keys: dict[int, str] = field(default_factory=dict)  # Redis: job -> lease key's token
    # What stats() says, and a full count of the store itself: (queue, status) -> jobs
    stats: dict[tuple[str, str], int] = field(default_factory=dict)
    counted: dict[tuple[str, str], int] = field(default_factory=dict)
    # The evaluation store: kind -> calls in the ledger's summary, and in its closed rows
    ledger: dict[str, int] = field(default_factory=dict)
    ledger_rows: dict[str, int] = field(default_factory=dict)
    ledger_open: int = 0  # rows of calls never closed
    keys_called_by_jobs: dict[str, int] = field(default_factory=dict)  # key -> jobs, if > 1
    eval_items: dict[str, int] = field(default_factory=dict)  # the batch's items by status
    # The batch in stages: its items by status; per document (reduce pieces, answered);
    # keys paid more than once (key -> call + failed rows); the reduce model's ledger.
    pipe_items: dict[str, int] = field(default_factory=dict)
    pipe_reduces: dict[str, tuple[int, int]] = field(default_factory=dict)
    pipe_keys_paid_twice: dict[str, int] = field(default_factory=dict)
    pipe_reduce_ledger: dict[str, int] = field(default_factory=dict)  # kind -> rows
    pipe_reduce_keys_paid: int = 0


async def observe(
    backend: PostgresBackend | RedisBackend,
    broker: Broker,
    expected: int,
    eval_batch: str | None = None,
    pipeline_batch: str | None = None,
) -> Observed:
    seen = Observed(backend.name, await _jobs(broker, expected))
    seen.stats = {
        (s.queue, st.value): n for s in await broker.stats() for st, n in s.counts.items() if n
    }
    seen.counted = backend.count_jobs()
    if isinstance(backend, PostgresBackend):
        seen.results = {
            int(r[0]): int(r[1]) for r in backend.fetch("SELECT job_id, token FROM chaos_results")
        }
        seen.writes = [
            (int(r[0]), int(r[1]))
            for r in backend.fetch("SELECT job_id, token FROM chaos_writes ORDER BY id")
        ]
        seen.writes_by = [
            (int(r[0]), int(r[1]), int(r[2]), float(r[3]))
            for r in backend.fetch(
                "SELECT job_id, token, pid, extract(epoch FROM at) FROM chaos_writes ORDER BY id"
            )
        ]
    else:
        seen.lease_keys = backend.lease_keys()
    if pipeline_batch is not None:
        _observe_pipeline(backend, seen, pipeline_batch)
    if eval_batch is not None or pipeline_batch is not None:
        store = backend.sql()
        seen.ledger = dict(store.fetch("SELECT kind, n FROM herd_eval_ledger_totals"))
        seen.ledger_rows = dict(
            store.fetch(
                "SELECT kind, count(*) FROM herd_eval_ledger WHERE state = 'closed' GROUP BY 1"
            )
        )
        ((seen.ledger_open,),) = store.fetch(
            "SELECT count(*) FROM herd_eval_ledger WHERE state = 'open'"
        )
        seen.keys_called_by_jobs = dict(
            store.fetch(
                "SELECT key, count(DISTINCT job_id) FROM herd_eval_ledger WHERE kind = 'call'"
                " AND state = 'closed' GROUP BY key HAVING count(DISTINCT job_id) > 1"
            )
        )
        if eval_batch is not None:
            seen.eval_items = dict(
                store.fetch(
                    "SELECT status, count(*) FROM herd_eval_items WHERE batch = %s GROUP BY 1",
                    (eval_batch,),
                )
            )
    return seen


def _observe_pipeline(backend: PostgresBackend | RedisBackend, seen: Observed, batch: str) -> None:
    store = backend.sql()
    seen.pipe_items = dict(
        store.fetch(
            "SELECT status, count(*) FROM herd_eval_items WHERE batch = %s GROUP BY 1", (batch,)
        )  # fmt: skip
    )
    seen.pipe_reduces = {
        path: (int(n), int(done))
        for path, n, done in store.fetch(
            # A reduce larger than its context runs in rounds: one piece in the last.
            "SELECT i.path, count(p.*), count(p.*) FILTER (WHERE p.status = 'done')"
            " FROM herd_eval_items i LEFT JOIN herd_eval_pieces p ON p.batch = i.batch"
            " AND p.path = i.path AND p.stage = %s AND p.round = (SELECT max(q.round)"
            " FROM herd_eval_pieces q WHERE q.batch = i.batch AND q.path = i.path"
            " AND q.stage = %s) WHERE i.batch = %s GROUP BY i.path",
            (REDUCE_STAGE, REDUCE_STAGE, batch),
        )
    }
    keys = "SELECT DISTINCT key FROM herd_eval_pieces WHERE batch = %s"
    seen.pipe_keys_paid_twice = dict(
        store.fetch(
            f"SELECT key, count(*) FROM herd_eval_ledger WHERE key IN ({keys})"
            " AND state = 'closed' AND kind IN ('call', 'failed') GROUP BY key"
            " HAVING count(*) > 1",
            (batch,),
        )
    )
    reduce_keys = f"{keys} AND stage = %s"
    seen.pipe_reduce_ledger = dict(
        store.fetch(
            f"SELECT kind, count(*) FROM herd_eval_ledger WHERE key IN ({reduce_keys})"
            " AND state = 'closed' GROUP BY kind",
            (batch, REDUCE_STAGE),
        )
    )
    ((n,),) = store.fetch(
        f"SELECT count(DISTINCT key) FROM herd_eval_ledger WHERE key IN ({reduce_keys})"
        " AND state = 'closed' AND kind = 'call'",
        (batch, REDUCE_STAGE),
    )
    seen.pipe_reduce_keys_paid = int(n)


async def check(
    backend: PostgresBackend | RedisBackend,
    broker: Broker,
    record: RunRecord,
    sim: dict[str, Any],
    run_dir: Path,
) -> Report:
    seen = await observe(
        backend, broker, len(record.job_ids), record.eval_batch, record.pipeline_batch
    )
    return evaluate(seen, record, sim, run_dir)


def evaluate(seen: Observed, record: RunRecord, sim: dict[str, Any], run_dir: Path) -> Report:
    jobs = seen.jobs
    report = Report(seen.backend, run_dir=str(run_dir))
    fig = report.figures
    expected = {int(k): v for k, v in record.job_ids.items()}
    side = _read_jsonl(sorted(run_dir.glob("side-*.jsonl")))

    # 1. every job is there and ended
    missing = sorted(set(expected) - set(jobs))
    if missing:
        report.violation(f"{len(missing)} jobs missing from the job store: {missing[:10]}")
    statuses = Counter(j.status.value for j in jobs.values() if j.id in expected)
    dead_reasons = Counter(
        j.dead_reason or "(none)" for j in jobs.values() if j.status == JobStatus.DEAD
    )
    for job_id, kind in expected.items():
        job = jobs.get(job_id)
        if job is None:
            continue
        if job.status.active:
            report.violation(f"job {job_id} ({kind}) never finished: {job.status.value}")
        elif job.status == JobStatus.DEAD and not job.dead_reason:
            report.violation(f"job {job_id} dead-lettered without a reason")
        elif kind == "poison" and job.status != JobStatus.DEAD:
            report.violation(f"poison job {job_id} ended {job.status.value}, not dead-lettered")

    # 2. one accepted result per job, from the final lease
    succeeded = {i: j for i, j in jobs.items() if j.status == JobStatus.SUCCEEDED and i in expected}
    for job in succeeded.values():
        token = job.result.get("token") if isinstance(job.result, dict) else None
        if token != job.lease_token:
            report.violation(
                f"job {job.id}: accepted result from token {token}, final lease {job.lease_token}"
            )
    refused_side = {(e["job"], e["token"]) for e in side if e["event"] == "refused"}
    landed = 0
    postgres = seen.backend == "postgres"
    if postgres:
        results = seen.results
        writes: dict[int, list[int]] = defaultdict(list)
        for job_id, token in seen.writes:
            writes[job_id].append(token)
            landed += 1
        for job in succeeded.values():
            if results.get(job.id) != job.lease_token:
                report.violation(
                    f"job {job.id}: fenced result row has token {results.get(job.id)},"
                    f" final lease {job.lease_token}"
                )
        for job_id, tokens in writes.items():
            if tokens != sorted(set(tokens)):
                report.violation(f"job {job_id}: fenced writes landed out of order: {tokens}")
            for token in tokens:
                if (job_id, token) in refused_side:
                    report.violation(f"job {job_id}: a refused write (token {token}) landed")
    worker_logs = sorted(run_dir.glob("worker-*.log"))
    lost: Counter[str] = Counter()
    for path in worker_logs:
        for m in _LOST.finditer(path.read_text(errors="replace")):
            lost[m.group(2)] += 1
    refused_writes = len(refused_side) + lost["completion refused"] + lost["failure write refused"]
    # The task's own LeaseLost is logged once more by the worker: count it once.
    lost_other = {k: v for k, v in lost.items() if k != "the task's fenced write was refused"}

    # 3. provider calls
    stats, tagged = sim["stats"], sim["calls"]
    calls_total = int(stats["calls"])
    untagged = calls_total - int(tagged["tagged_calls"])
    if untagged:
        report.violation(f"{untagged} provider calls carry no job:token:pid tag")
    next_start: dict[tuple[int, int], float] = {}
    began: dict[tuple[int, int], float] = {}
    starts: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for e in side:
        if e["event"] == "start":
            starts[e["job"]].append((e["token"], e["t"]))
            began[(e["job"], e["token"])] = e["t"]
    for job_id, seq in starts.items():
        seq.sort()
        for (token, _), (_, t_next) in zip(seq, seq[1:], strict=False):
            next_start[(job_id, token)] = t_next
    windows = _fault_windows(record)
    accepted = cut_short = 0
    unexplained: list[str] = []
    cut_by: Counter[str] = Counter()
    per_job_accepted: Counter[int] = Counter()
    for tag, calls in tagged["tags"].items():
        job_id, token, pid = (int(x) for x in tag.split(":"))
        job = jobs.get(job_id)
        for call in calls:
            if job is not None and job.status == JobStatus.SUCCEEDED and token == job.lease_token:
                accepted += 1
                per_job_accepted[job_id] += 1
                continue
            # The attempt's life: from its start to the job's next attempt. A fault of its
            # worker in that span doomed it (a stopped worker resumes and may start a call
            # before its heartbeat learns the lease is gone); a fault of the job store
            # reaches the attempts that found a cut connection later (GLOBAL_FAULT_REACH).
            horizon = next_start.get((job_id, token), record.ended)
            life = began.get((job_id, token), call["start"])
            cause = None
            for kind, fpid, t0, t1 in windows:
                if fpid is not None:
                    hit = fpid == pid and t0 <= horizon and t1 >= life
                else:
                    hit = t0 <= horizon and t1 >= life - GLOBAL_FAULT_REACH
                if hit:
                    cause = kind
                    break
            if cause is None:
                unexplained.append(f"{tag}@{call['start']:.1f}")
            else:
                cut_short += 1
                cut_by[cause] += 1
    for job in succeeded.values():
        if expected.get(job.id) == "work" and per_job_accepted[job.id] != 1:
            report.violation(
                f"job {job.id}: its accepted attempt made {per_job_accepted[job.id]} calls, not 1"
            )
    if unexplained:
        report.violation(
            f"{len(unexplained)} provider calls wasted with no fault to explain them:"
            f" {unexplained[:10]}"
        )
    n_succeeded = sum(1 for i in succeeded if expected.get(i) == "work")
    if calls_total > n_succeeded + cut_short:
        report.violation(
            f"provider calls {calls_total} > succeeded jobs {n_succeeded} + cut short {cut_short}"
        )

    # 4. leases held at the end
    now = datetime.now(UTC)
    held = 0
    for job in jobs.values():
        if (
            job.status == JobStatus.PROCESSING
            and job.lease_expires_at
            and (job.lease_expires_at > now)
        ):
            held += 1
            owner = pid_of_owner(job.lease_owner)
            if owner is None or not alive(owner):
                report.violation(f"job {job.id}: lease held by {job.lease_owner}, no live worker")
    if not postgres:
        for job_id, token in seen.lease_keys.items():
            holder = jobs.get(job_id)
            owner = pid_of_owner(holder.lease_owner) if holder else None
            if (
                holder is None
                or holder.status != JobStatus.PROCESSING
                or owner is None
                or not alive(owner)
            ):
                report.violation(f"lease key of job {job_id} (token {token}) outlived its lease")

    lease_seconds = float(record.config.get("lease", 0.0) or 0.0)
    deaths = {
        int(f["pid"]): float(f.get("until") or f["t"])
        for f in record.faults
        if f["kind"] in ("kill", "term")
    }
    for held_then in record.lease_snapshot:
        if held_then["alive"]:
            continue
        died = deaths.get(held_then["pid"] or -1)
        if died is None or held_then["t"] - died > lease_seconds + 1.0:
            report.violation(
                f"job {held_then['job']}: lease held by dead worker {held_then['pid']} when the"
                f" faults stopped, {'never killed' if died is None else 'killed long before'}"
            )

    # 5. workers
    for exit_ in record.unexpected_exits:
        report.violation(f"worker {exit_['pid']} exited by itself (code {exit_['code']})")
    for pid, code in record.drain_exit_codes.items():
        if code != 0:
            report.violation(f"worker {pid} exited {code} on the drain's SIGTERM (expected 0)")

    faults = Counter(f["kind"] for f in record.faults if f["kind"] not in ("cont", "heal"))
    fig["jobs"] = len(expected)
    fig["outcome"] = dict(statuses)
    fig["dead_reasons"] = dict(dead_reasons)
    fig["attempts_started"] = sum(1 for e in side if e["event"] == "start")
    fig["faults_injected"] = dict(faults)
    fig["leases_taken_over"] = sum(j.stalls for j in jobs.values())
    fig["lease_losses_seen_by_workers"] = lost_other
    fig["fenced_writes_refused"] = refused_writes
    fig["fenced_writes_refused_that_landed"] = sum(
        1 for v in report.violations if "a refused write" in v
    )
    if postgres:
        fig["fenced_result_writes_landed"] = landed
    fig["provider_calls"] = calls_total
    fig["provider_calls_accepted"] = accepted
    fig["provider_calls_cut_short"] = cut_short
    fig["cut_short_by"] = dict(cut_by)
    fig["calls_bound"] = (
        f"{calls_total} <= {n_succeeded} succeeded + {cut_short} cut short:"
        f" {'holds' if calls_total <= n_succeeded + cut_short else 'BROKEN'}"
    )
    fig["leases_held_when_faults_stopped"] = (
        f"{len(record.lease_snapshot)}"
        f" ({sum(1 for x in record.lease_snapshot if not x['alive'])} by workers that died"
        " less than a lease before)"
    )
    fig["leases_held_at_end"] = held
    fig["drained"] = f"{record.drained} in {record.drain_seconds:.1f}s"
    # 6. the maintained counts (triggers, scripts) equal a full count after the faults
    fig["stats_match_full_count"] = seen.stats == seen.counted
    if seen.stats != seen.counted:
        report.violation(f"stats() says {seen.stats}, a full count {seen.counted}")
    if any(f["kind"] in NET_FAULTS for f in record.faults):
        _check_partitions(seen, record, sim, side, report)
    if record.eval_batch is not None or record.pipeline_batch is not None:
        _check_ledger(seen, record, sim, report)
    if record.pipeline_batch is not None:
        _check_pipeline(seen, record, sim, report)
    fig["run_seconds"] = round((record.ended or time.time()) - record.started, 1)
    return report


def _check_partitions(
    seen: Observed,
    record: RunRecord,
    sim: dict[str, Any],
    side: list[dict[str, Any]],
    report: Report,
) -> None:
    """Guarantee 8: a cut-off worker gives up its calls at its local lease deadline, and
    nothing it writes after the heal is accepted from a lease it lost."""
    fig = report.figures
    lease = float(record.config.get("lease", 0.0) or 0.0)
    # The heartbeat looks at its deadline once per tick (a third of the lease); 1 s more
    # for a loaded machine.
    slack = lease / 3 + 1.0
    calls: list[tuple[int, str, dict[str, Any]]] = []
    for tag, recs in sim["calls"]["tags"].items():
        pid = int(tag.split(":")[2])
        calls += [(pid, tag, c) for c in recs]
    overlapping = cancelled = late = 0
    after_heal_refused = 0
    late_writes: set[tuple[int, int, int, float]] = set()
    for f in record.faults:
        if f["kind"] not in ("cut", "oneway", "isolate"):
            continue
        t0, t1 = float(f["t"]), float(f.get("until") or f["t"])
        pids = set(f["pids"])
        deadline = t0 + lease + slack
        if t1 > deadline:
            for pid, tag, c in calls:
                end = c["end"] if c["end"] is not None else record.ended
                if pid not in pids or c["start"] >= t1 or end <= t0:
                    continue
                overlapping += 1
                if end > deadline:
                    late += 1
                    report.violation(
                        f"worker {pid} cut off ({f['kind']}) at {t0:.1f} for {t1 - t0:.1f}s"
                        f" kept its model call {tag} open {end - t0:.1f}s into the cut,"
                        f" past its local lease deadline (lease {lease:g}s)"
                    )
                elif c["status"] is None:
                    cancelled += 1
        for e in side:
            if e["event"] == "refused" and e.get("pid") in pids and e["t"] >= t1:
                after_heal_refused += 1
        for job_id, token, pid, at in seen.writes_by:
            if pid in pids and at >= t1:
                late_writes.add((job_id, token, pid, at))
    # A write from an older lease may land after the heal while that lease still holds
    # (its completion refused later); it must not land once a newer attempt began.
    began = {(e["job"], e["token"]): e["t"] for e in side if e["event"] == "start"}
    for job_id, token, pid, at in sorted(late_writes):
        newer = [t for (j, k), t in began.items() if j == job_id and k > token and t < at]
        if newer:
            report.violation(
                f"job {job_id}: a write of cut-off worker {pid} (token {token}) landed after"
                f" the heal, {at - min(newer):.1f}s after a newer attempt began"
            )
    fig["partition_calls_overlapping_cuts"] = overlapping
    fig["partition_calls_hung_up_by_deadline"] = cancelled
    fig["partition_calls_past_deadline"] = late
    fig["partition_writes_after_heal"] = (
        f"{after_heal_refused} refused, {len(late_writes)} accepted"
        " (none after a newer attempt began)"
    )


def _check_ledger(seen: Observed, record: RunRecord, sim: dict[str, Any], report: Report) -> None:
    """Guarantee 7: the evaluations' ledger equals their provider's bill."""
    fig = report.figures
    for job_id in sorted(int(k) for k in record.eval_job_ids):
        job = seen.jobs.get(job_id)
        if job is None:
            report.violation(f"evaluation job {job_id} is missing from the job store")
        elif job.status != JobStatus.SUCCEEDED:
            report.violation(
                f"evaluation job {job_id} ended {job.status.value}:"
                f" {job.dead_reason or ''} {job.last_error or ''}".rstrip()
            )
    items = sum(seen.eval_items.values())
    done = seen.eval_items.get("done", 0)
    if items != record.eval_documents:
        report.violation(
            f"evaluations: {record.eval_documents} documents submitted, {items} items stored"
        )
    if done != items:
        others = {k: v for k, v in seen.eval_items.items() if k != "done"}
        report.violation(f"evaluations: {items - done} documents not done: {others}")
    paid = sum(seen.ledger.get(k, 0) for k in PAID)
    rows = sum(seen.ledger_rows.get(k, 0) for k in PAID)
    stats = sim["eval"]["stats"]
    # "billed": requests that began generating (a client that hung up included); a
    # simulator without that counter bills every call it received.
    billed = int(stats.get("billed", stats["calls"]))
    # A call closed "cut_short" (its worker killed or frozen) or "lost" (its lease lost,
    # the request cancelled) may have been stopped before the provider saw it: nobody
    # can tell, so the ledger counts it. Such calls may stand above the bill; nothing
    # else may, and the ledger may never fall short of it.
    lost = seen.ledger.get("lost", 0) + seen.ledger.get("cut_short", 0)
    within = billed <= paid <= billed + lost
    if not within:
        report.violation(
            f"ledger != bill: {paid} calls in the ledger {_paid(seen.ledger)},"
            f" {billed} billed by the provider"
        )
    if rows != paid:
        report.violation(f"the ledger's summary counts {paid} calls, its rows {rows}")
    if seen.ledger_open:
        report.violation(f"{seen.ledger_open} ledger calls were never closed")
    for key, n in sorted(seen.keys_called_by_jobs.items()):
        report.violation(f"key {key[:12]}… has 'call' rows from {n} jobs")
    hit = sum(seen.ledger.get(k, 0) for k in ("lost", "failed", "cut_short"))
    jobs = len(record.eval_job_ids)
    fig["eval_documents"] = f"{done}/{record.eval_documents} done by {jobs} jobs"
    fig["eval_ledger"] = {k: seen.ledger[k] for k in sorted(seen.ledger)}
    fig["eval_calls_hit_by_faults"] = hit
    if paid == billed:
        verdict = "equal"
    elif within:
        verdict = f"equal but for {paid - billed} of the {lost} calls cut off mid-call"
    else:
        verdict = "DIFFERENT"
    fig["eval_ledger_equals_bill"] = (
        f"{paid} in the ledger, {billed} billed ({stats.get('disconnected', 0)} hung up): {verdict}"
    )


def _check_pipeline(seen: Observed, record: RunRecord, sim: dict[str, Any], report: Report) -> None:
    """Guarantee 9: one reduce per document, no key paid twice, the reduce model's bill."""
    fig = report.figures
    items = sum(seen.pipe_items.values())
    done = seen.pipe_items.get("done", 0)
    if items != record.pipeline_documents:
        report.violation(
            f"pipeline: {record.pipeline_documents} documents submitted, {items} items stored"
        )
    if done != items:
        others = {k: v for k, v in seen.pipe_items.items() if k != "done"}
        report.violation(f"pipeline: {items - done} documents without a final answer: {others}")
    wrong = {p: nd for p, nd in seen.pipe_reduces.items() if nd != (1, 1)}
    for path, (n, answered) in sorted(wrong.items())[:10]:
        report.violation(f"pipeline: {path} has {n} reduce pieces, {answered} answered (not 1)")
    for key, n in sorted(seen.pipe_keys_paid_twice.items())[:10]:
        report.violation(f"pipeline: key {key[:12]}… paid {n} times (call or failed rows)")
    cut = seen.pipe_reduce_ledger.get("cut_short", 0) + seen.pipe_reduce_ledger.get("lost", 0)
    billed = int(sim.get("eval", {}).get("stats", {}).get("by_model", {}).get(REDUCE_MODEL, 0))
    paid = seen.pipe_reduce_keys_paid
    if billed > paid + cut:
        report.violation(
            f"pipeline: the simulator billed {billed} reduce calls for {paid} distinct reduce"
            f" inputs paid and {cut} cut short or lost"
        )
    fig["pipeline_documents"] = (
        f"{done}/{record.pipeline_documents} answered,"
        f" {sum(1 for nd in seen.pipe_reduces.values() if nd == (1, 1))} with one reduce"
    )
    fig["pipeline_reduce_calls"] = (
        f"{billed} billed for {paid} distinct inputs ({cut} cut short or lost)"
    )
    fig["pipeline_keys_paid_twice"] = len(seen.pipe_keys_paid_twice)


def _paid(ledger: dict[str, int]) -> str:
    return "(" + ", ".join(f"{k} {ledger.get(k, 0)}" for k in PAID) + ")"
