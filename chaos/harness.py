"""One chaos run: a simulator, N herd workers, jobs, faults on a schedule, a drain, a check.

Besides its own jobs the run submits a batch of herd's evaluation jobs (``herd.eval``,
some documents repeated) against a second simulator, so that the provider's bill for
them is not mixed with the chaos jobs' calls: one wave of documents shortly before
each fault aimed at a worker, and that fault aimed at a worker running one, so that
kills, stops and terminations land mid-call and the cost ledger must account for it.

Every fault is bounded in count and in time (a stopped worker is continued, a
stopped server is started again) and the run ends by itself: after the fault
phase it stops injecting, continues every stopped worker, waits until every job
has finished (or the drain deadline passes), stops the workers with SIGTERM,
and hands the job store and the simulator's records to the checker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from chaos import pipeline as chaos_pipeline
from chaos.backends import (
    ROOT,
    NetnsPostgresBackend,
    PostgresBackend,
    RedisBackend,
    alive,
    make_backend,
    pid_of_owner,
)
from chaos.checker import Report, check
from chaos.netns import Host, Network
from chaos.record import RunRecord
from herd import App
from herd.errors import BrokerError, HerdError, InvalidInput
from herd.llm import eval as evaluate
from herd.llm.eval import EvalSpec, batch_status, enqueue_documents, settle
from herd.llm.eval.pipesubmit import submit_pipeline_texts
from herd.llm.eval.stages import STAGE_TASK
from herd.queue.base import JobStatus
from herd.testing.fleet import Fleet, Member, herd_worker, worker_env
from herd.testing.simulator import SimulatorProcess

log = logging.getLogger("chaos")

NET_FAULTS = ("cut", "oneway", "slow", "isolate")  # with ChaosConfig.network only
FAULT_KINDS = ("kill", "stop", "term", "restart", "drop", *NET_FAULTS)
EVAL_LEAD = 0.6  # seconds a wave of evaluations goes in before the fault it is aimed at
EVAL_SPEC = EvalSpec(
    model="sim-chaos-eval",
    system="Rate the document's clarity from 1 to 5 and name its topic. Answer in JSON.",
    schema={
        "type": "object",
        "properties": {
            "clarity": {"type": "integer", "minimum": 1, "maximum": 5},
            "topic": {"type": "string"},
        },
        "required": ["clarity", "topic"],
    },
)
_WORDS = (
    "ledger", "river", "harvest", "signal", "archive", "budget", "engine", "winter", "clause",
    "survey", "council", "border", "repair", "market", "station", "tenant", "report", "the",
)  # fmt: skip


@dataclass
class ChaosConfig:
    backend: str = "postgres"
    workers: int = 3
    concurrency: int = 3  # jobs in flight per worker process
    jobs: int = 150
    poison_share: float = 0.02  # jobs that always fail: they must end dead-lettered
    flaky_share: float = 0.05  # jobs that fail their first attempt
    job_seconds: tuple[float, float] = (0.1, 0.9)  # the task's own work, drawn uniformly
    call_seconds: tuple[float, float] = (0.1, 0.5)  # the simulator's latency per call
    lease: float = 3.0
    grace: float = 1.0  # seconds a SIGTERMed worker gives its running jobs
    fault_phase: float = 25.0  # seconds during which faults are injected
    faults: dict[str, int] = field(
        default_factory=lambda: {"kill": 2, "stop": 1, "term": 1, "restart": 1, "drop": 1}
    )
    stop_seconds: float = 0.0  # how long a SIGSTOP lasts; 0: the lease plus 2 s
    # > 0: one partition at a time, the next one at least this many seconds after the
    # last heal (0: the faults come when drawn, overlapping or not)
    fault_gap: float = 0.0
    down_seconds: float = 1.0  # how long a restarted server stays down
    drain_timeout: float = 120.0
    eval_docs: int = 36  # evaluation documents submitted (0: none)
    eval_repeats: float = 0.25  # share of them that repeat an earlier document
    eval_call_seconds: tuple[float, float] = (0.5, 1.5)  # long enough for a fault to land
    # A batch in stages (chaos/pipeline.py) on the evaluations' simulator: documents
    # (0: none) of sections (low, high) each, submitted before the first worker fault.
    pipeline_docs: int = 0
    pipeline_sections: tuple[int, int] = (3, 10)
    seed: int = 1
    run_dir: Path | None = None  # logs, side logs, records (default: a temporary folder)
    home: Path = ROOT / ".herd-test" / "chaos-home"  # the chaos run's own PostgreSQL
    database: str = "herd_chaos"  # its database on that server
    # Partitions (chaos/netns.py): the job store and the workers on hosts of their own.
    network: bool = False
    hosts: int = 3  # worker hosts; the workers are spread over them
    # How long a cut, a one-way cut or an isolation lasts; 0: past the workers' local
    # lease deadline (lease + a heartbeat tick + 1 s) by 2 s, so the deadline is tested.
    cut_seconds: float = 0.0
    slow_seconds: float = 0.0  # how long a host's link is slow; 0: lease + 2 s
    slow_delay: float = 0.5  # the slow link's added latency per packet, seconds
    slow_loss: float = 0.1  # and the share of its packets lost


@dataclass
class _Proc:
    """A worker of the fleet and what the run planned and did to it."""

    member: Member
    stopped_until: float | None = None  # monotonic time of the planned SIGCONT
    stop_event: dict[str, Any] | None = None  # its "until" becomes the actual SIGCONT time
    signalled: str | None = None  # "kill" / "term": its exit is expected
    host: Host | None = None  # its network namespace (network runs)
    fault: dict[str, Any] | None = None  # the kill / term event, closed when it exits

    @property
    def pid(self) -> int:
        return self.member.pid

    @property
    def popen(self) -> subprocess.Popen[bytes]:
        return self.member.popen

    @property
    def log(self) -> Path:
        assert self.member.log is not None  # the fleet keeps logs in the run's folder
        return self.member.log


class Harness:
    def __init__(self, config: ChaosConfig) -> None:
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.dir = config.run_dir or Path(tempfile.mkdtemp(prefix=f"chaos-{config.backend}-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.net: Network | None = None
        # Partitions scheduled to heal: (monotonic time, filters to remove, hosts, event)
        self._last_heal = 0.0
        self.heals: list[tuple[float, list[tuple[Host, int]], list[Host], dict[str, Any]]] = []
        self.backend: PostgresBackend | RedisBackend
        if config.network:
            if config.backend != "postgres":
                raise ValueError(f"backend {config.backend!r}: partition runs are postgres only")
            self.net = Network(config.hosts, self.dir)
            self.backend = NetnsPostgresBackend(
                self.net.store.address, self.net.prefix(self.net.store), config.database
            )
        else:
            self.backend = make_backend(config.backend, config.home, self.dir, config.database)
        self.procs: list[_Proc] = []
        self.fleet: Fleet | None = None  # once the simulators, which its workers call, run
        self.sim: SimulatorProcess | None = None
        self.sim_url = ""
        self.eval_sim: SimulatorProcess | None = None
        self.eval_sim_url = ""
        self.eval_waves: list[list[tuple[str, str]]] = []  # (name, text) per wave
        self.producer: App | None = None
        cfg = asdict(config)
        cfg["run_dir"], cfg["home"] = str(self.dir), str(config.home)
        self.record = RunRecord(config=cfg)
        self._faults_file = (self.dir / "faults.jsonl").open("a")

    # -- pieces

    def _fault(self, kind: str, **data: Any) -> dict[str, Any]:
        event = {"t": time.time(), "kind": kind, **data}
        self.record.faults.append(event)
        self._faults_file.write(json.dumps(event) + "\n")
        self._faults_file.flush()
        log.info("fault: %s", event)
        return event

    def _start_simulator(self) -> None:
        self.sim, self.sim_url = self._simulator("simulator", self.cfg.call_seconds)
        if self.cfg.eval_docs or self.cfg.pipeline_docs:
            self.eval_sim, self.eval_sim_url = self._simulator(
                "simulator-eval", self.cfg.eval_call_seconds
            )

    def _simulator(self, name: str, latency: tuple[float, float]) -> tuple[SimulatorProcess, str]:
        low, high = latency
        # On a network run the workers reach the simulators over the bridge (no fault
        # is put on that path but the slow link, which delays everything a host sends).
        host = self.net.gateway if self.net is not None else "127.0.0.1"
        sim = SimulatorProcess(
            "--latency", f"{low}:{high}", "--seed", str(self.cfg.seed),
            host=host, log=self.dir / f"{name}.log", env=worker_env(pythonpath=[ROOT]),
        )  # fmt: skip
        return sim, sim.url

    def _start_fleet(self) -> Fleet:
        env = worker_env(
            home=self.cfg.home,
            pythonpath=[ROOT],
            CHAOS_DIR=str(self.dir),
            CHAOS_SIM_URL=self.sim_url,
            CHAOS_LEASE=str(self.cfg.lease),
            OPENAI_BASE_URL=f"{self.eval_sim_url}/v1",
            OPENAI_API_KEY="sk-chaos-eval",
            # A killed evaluation's retry waits out its singleflight lock: as long as a lease.
            HERD_EVAL_LOCK_TTL=str(max(1, round(self.cfg.lease))),
            **self.backend.worker_env(),
        )
        argv = herd_worker("chaos.app:app", "--concurrency", str(self.cfg.concurrency),
                           "--poll-interval", "0.2", "--grace", str(self.cfg.grace))  # fmt: skip
        return Fleet(argv, env, logs=self.dir, cwd=ROOT)

    def _spawn(self) -> _Proc:
        assert self.fleet is not None
        host = self._next_host()
        # `ip netns exec` execs the command in place: the pid is the worker's own.
        prefix = self.net.prefix(host) if self.net is not None and host is not None else []
        (member,) = self.fleet.start(prefix=prefix)
        proc = _Proc(member, host=host)
        self.procs.append(proc)
        self.record.worker_pids.append(proc.pid)
        for _, _, hosts, event in self.heals:
            if host in hosts:  # started on a host that is cut off now: cut off too
                event["pids"].append(proc.pid)
        with (self.dir / "workers.jsonl").open("a") as fh:
            entry = {"seq": member.seq, "pid": proc.pid, "log": proc.log.name,
                     "host": host.name if host else None}  # fmt: skip
            fh.write(json.dumps(entry) + "\n")
        return proc

    async def _workers_ready(self, timeout: float = 90.0) -> None:
        """Until every worker logged that it is serving its queues."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(b"queues " in p.log.read_bytes() for p in self.procs):
                return
            self._reap_and_replace()
            await asyncio.sleep(0.1)
        log.warning("not every worker started within %.0f s; the faults begin anyway", timeout)

    def _next_host(self) -> Host | None:
        """The worker host with the fewest live workers (a replacement takes the place
        of the one it replaces)."""
        if self.net is None:
            return None
        load = {h.name: 0 for h in self.net.workers}
        for p in self.procs:
            if p.host is not None and p.popen.poll() is None and p.signalled is None:
                load[p.host.name] += 1
        return min(self.net.workers, key=lambda h: load[h.name])

    def _live(self) -> list[_Proc]:
        return [p for p in self.procs if p.popen.poll() is None and p.signalled is None]

    def _reap_and_replace(self, replace: bool = True) -> None:
        for p in list(self.procs):
            code = p.popen.poll()
            if code is None:
                continue
            self.procs.remove(p)
            if p.fault is not None:
                # A SIGTERMed worker lets its running jobs go on for the grace period (and
                # they may start a call then): the fault lasts until the process is gone.
                p.fault["until"] = time.time()
                self._faults_file.write(json.dumps({**p.fault, "kind": "exited"}) + "\n")
            if p.signalled is None:
                self.record.unexpected_exits.append(
                    {"pid": p.pid, "code": code, "log": p.log.name, "t": time.time()}
                )
                log.error("worker %d exited by itself (%s): see %s", p.pid, code, p.log)
        if replace:
            while len([p for p in self.procs if p.signalled is None]) < self.cfg.workers:
                self._spawn()

    async def _holders(self, broker: Any) -> tuple[dict[int, int], set[int]]:
        """pid -> number of jobs it holds, and the pids holding an evaluation job
        (empty if the job store cannot say now)."""
        try:
            jobs = await broker.list_jobs(status=JobStatus.PROCESSING, limit=10_000)
        except BrokerError:
            return {}, set()
        out: dict[int, int] = {}
        evaluating: set[int] = set()
        for j in jobs:
            pid = pid_of_owner(j.lease_owner)
            if pid is not None:
                out[pid] = out.get(pid, 0) + 1
                if j.task in (evaluate.TASK, STAGE_TASK):
                    evaluating.add(pid)
        return out, evaluating

    async def _pick_worker(self, broker: Any) -> _Proc | None:
        live = [p for p in self._live() if p.stopped_until is None]
        if not live:
            return None
        holders, evaluating = await self._holders(broker)
        # A worker mid-evaluation first: the ledger must account for the call it cuts.
        calling = [p for p in live if p.pid in evaluating]
        busy = [p for p in live if holders.get(p.pid)]
        return self.rng.choice(calling or busy or live)

    async def _inject(self, kind: str, broker: Any) -> None:
        if kind in ("kill", "stop", "term"):
            proc = await self._pick_worker(broker)
            if proc is None:
                return
            assert self.fleet is not None
            if kind == "kill":
                proc.signalled = "kill"
                self.fleet.kill(proc.pid)
                proc.fault = self._fault("kill", pid=proc.pid)
            elif kind == "term":
                proc.signalled = "term"
                self.fleet.terminate(proc.pid)
                proc.fault = self._fault("term", pid=proc.pid)
            else:
                seconds = self.cfg.stop_seconds or self.cfg.lease + 2.0
                self.fleet.freeze(proc.pid)
                proc.stopped_until = time.monotonic() + seconds
                proc.stop_event = self._fault("stop", pid=proc.pid, until=time.time() + seconds)
        elif kind == "restart":
            event = self._fault(f"{self.backend.name}_restart", until=None)
            await asyncio.to_thread(self.backend.restart, self.cfg.down_seconds)
            event["until"] = time.time()
            self._faults_file.write(json.dumps({**event, "kind": "restart_done"}) + "\n")
        elif kind == "drop":
            event = self._fault(f"{self.backend.name}_drop")
            event["dropped"] = await asyncio.to_thread(self.backend.drop_connections)
        elif kind in NET_FAULTS:
            await self._partition(kind, broker)
        elif kind.startswith("eval:"):
            await self._submit_evals(int(kind.partition(":")[2]))
        elif kind == "pipeline":
            await self._submit_pipeline()

    async def _partition(self, kind: str, broker: Any) -> None:
        """Cut a worker host off the job store (both ways, or only the store's answers),
        slow its link down, or cut every worker host off the store; healed later."""
        net = self.net
        if net is None:
            raise ValueError(f"fault {kind!r} needs a network run (ChaosConfig.network)")
        lease = self.cfg.lease
        if kind == "slow":
            seconds = self.cfg.slow_seconds or lease + 2.0
        else:
            seconds = self.cfg.cut_seconds or lease * 4 / 3 + 3.0
        if kind == "isolate":
            hosts = list(net.workers)
        else:
            proc = await self._pick_worker(broker)
            candidates = [h for h in net.workers if kind != "slow" or h.pump is None]
            if not candidates:
                return
            host = proc.host if proc is not None and proc.host in candidates else None
            hosts = [host or self.rng.choice(candidates)]
        if kind != "slow":
            await self._aim_mid_call([p.pid for p in self.procs if p.host in hosts])
        handles: list[tuple[Host, int]] = []
        for h in hosts:
            if kind in ("cut", "isolate"):
                handles += net.cut(h, net.store)
            elif kind == "oneway":
                # The worker's statements reach the store (its renewals commit there) but
                # no answer comes back: the worker cannot tell its lease was renewed.
                handles += net.drop(net.store, h)
            else:
                handles += await asyncio.to_thread(
                    net.impair, h, self.cfg.slow_delay, self.cfg.slow_loss
                )
        pids = [p.pid for p in self.procs if p.host in hosts and p.popen.poll() is None]
        extra = {"delay": self.cfg.slow_delay, "loss": self.cfg.slow_loss} if kind == "slow" else {}
        event = self._fault(
            kind, hosts=[h.name for h in hosts], pids=pids, until=time.time() + seconds, **extra
        )
        self.heals.append((time.monotonic() + seconds, handles, hosts, event))

    async def _aim_mid_call(self, pids: list[int], timeout: float = 5.0) -> None:
        """Lengthen the simulator's calls until one of ``pids`` has a call in flight that
        outlasts the cut's lease deadline (3 leases long): the cut must then end it."""
        low, high = self.cfg.call_seconds
        long = 3 * self.cfg.lease
        async with httpx.AsyncClient(base_url=self.sim_url, timeout=10) as client:
            await client.post("/_sim/config", json={"latency": f"{long}:{long}"})
            since = time.time()
            deadline = time.monotonic() + timeout
            try:
                while time.monotonic() < deadline:
                    tags = (await client.get("/_sim/calls")).json()["tags"]
                    if any(
                        int(tag.split(":")[2]) in pids and c["end"] is None and c["start"] >= since
                        for tag, calls in tags.items()
                        for c in calls
                    ):
                        return
                    self._continue_due()  # the schedule goes on meanwhile
                    self._heal_due()
                    await asyncio.sleep(0.1)
                log.warning("no call of %s in flight to cut; cutting anyway", pids)
            finally:
                await client.post("/_sim/config", json={"latency": f"{low}:{high}"})

    def _held_back(self) -> bool:
        """With fault_gap: a partition is healing, or healed less than fault_gap ago."""
        gap = self.cfg.fault_gap
        return gap > 0 and (bool(self.heals) or time.monotonic() < self._last_heal + gap)

    def _heal_due(self, force: bool = False) -> None:
        assert self.net is not None or not self.heals
        now = time.monotonic()
        for item in list(self.heals):
            due, handles, hosts, event = item
            if force or now >= due:
                assert self.net is not None
                self.net.heal(handles)
                if event["kind"] == "slow":
                    for h in hosts:
                        self.net.stop_pump(h)
                self.heals.remove(item)
                self._last_heal = time.monotonic()
                event["until"] = time.time()
                self._fault("heal", hosts=event["hosts"], of=event["kind"])

    def _continue_due(self, force: bool = False) -> None:
        now = time.monotonic()
        for p in self.procs:
            if p.stopped_until is not None and (force or now >= p.stopped_until):
                assert self.fleet is not None
                self.fleet.thaw(p.pid)
                p.stopped_until = None
                if p.stop_event is not None:
                    p.stop_event["until"] = time.time()
                self._fault("cont", pid=p.pid)

    def _schedule(self) -> list[tuple[float, str]]:
        plan = []
        for kind, count in self.cfg.faults.items():
            if kind not in FAULT_KINDS:
                raise ValueError(f"unknown fault {kind!r}: one of {', '.join(FAULT_KINDS)}")
            for _ in range(count):
                plan.append((self.rng.uniform(1.0, max(1.5, self.cfg.fault_phase - 1.0)), kind))
        return sorted(plan)

    # -- the run

    async def _enqueue(self, app: App) -> None:
        n_poison = round(self.cfg.jobs * self.cfg.poison_share)
        work = []
        for _ in range(self.cfg.jobs - n_poison):
            work.append(
                {
                    "seconds": round(self.rng.uniform(*self.cfg.job_seconds), 3),
                    "flaky": self.rng.random() < self.cfg.flaky_share,
                }
            )
        for start in range(0, len(work), 500):
            for r in await app.enqueue_many("chaos.work", work[start : start + 500]):
                self.record.job_ids[r.job_id] = "work"
        if n_poison:
            for r in await app.enqueue_many("chaos.poison", [{} for _ in range(n_poison)]):
                self.record.job_ids[r.job_id] = "poison"

    def _plan_evals(self, plan: list[tuple[float, str]]) -> list[tuple[float, str]]:
        """Documents (some repeated: deduplicated onto a running job, or answered from
        the cache) in one wave per fault aimed at a worker, EVAL_LEAD s before it; the
        pipeline's documents before the first such fault, so its maps are under way."""
        if self.cfg.pipeline_docs:
            first = min((t for t, k in plan if k in ("kill", "stop", "term")), default=0.0)
            plan = sorted([*plan, (max(0.0, first - 2 * EVAL_LEAD), "pipeline")])
        n = self.cfg.eval_docs
        if not n:
            return plan
        texts: list[str] = []
        for i in range(n):
            if texts and self.rng.random() < self.cfg.eval_repeats:
                texts.append(self.rng.choice(texts))
            else:
                words = " ".join(self.rng.choice(_WORDS) for _ in range(self.rng.randint(20, 60)))
                texts.append(f"Document {i}.\n{words.capitalize()}.")
        times = [t for t, kind in plan if kind in ("kill", "stop", "term")] or [0.0]
        per = -(-n // len(times))
        items = [(f"doc-{i:03d}.txt", text) for i, text in enumerate(texts)]
        self.eval_waves = [items[i : i + per] for i in range(0, n, per)]
        waves = [(max(0.0, t - EVAL_LEAD), f"eval:{w}") for w, t in enumerate(times)]
        return sorted(plan + waves[: len(self.eval_waves)])

    async def _submit_evals(self, wave: int) -> None:
        """Submit one wave (retried while the job store is down: a repeat is deduplicated)."""
        assert self.producer is not None and self.record.eval_batch is not None
        items = self.eval_waves[wave]
        deadline = time.monotonic() + 30.0
        while True:
            try:
                with self._provider_env():
                    results = await enqueue_documents(
                        self.producer, EVAL_SPEC, self.record.eval_batch, items
                    )
                break
            except (HerdError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise
                log.info("eval wave %d: %s; again", wave, exc)
                await asyncio.sleep(0.2)
        keys = [EVAL_SPEC.key(text) for _, text in items]
        for r, key in zip(results, keys, strict=True):
            self.record.eval_job_ids[r.job_id] = key
        self.record.eval_documents += len(items)
        self.record.eval_waves.append({"t": time.time(), "documents": len(items)})

    def _provider_env(self) -> AbstractContextManager[None]:
        """A submission is checked as a user's is (its provider's key set): the key and
        server are those the workers are given, the evaluations' simulator."""
        return _environ(OPENAI_BASE_URL=f"{self.eval_sim_url}/v1", OPENAI_API_KEY="sk-chaos-eval")

    async def _submit_pipeline(self) -> None:
        """The pipeline's batch (retried while the job store is down: the batch is made
        once, its name refused after that, and a run that made it is done)."""
        assert self.producer is not None and self.record.pipeline_batch is not None
        rng = random.Random(self.cfg.seed + 1)
        docs = chaos_pipeline.manuals(rng, self.cfg.pipeline_docs, self.cfg.pipeline_sections)
        deadline = time.monotonic() + 30.0
        while True:
            try:
                with self._provider_env():
                    report = await submit_pipeline_texts(
                        self.producer, chaos_pipeline.pipeline(), docs,
                        batch=self.record.pipeline_batch,
                    )  # fmt: skip
                log.info("pipeline: %d documents, %d pieces queued", len(docs), report.queued)
                break
            except InvalidInput:
                break  # made by an earlier try whose answer the fault cut off
            except (HerdError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise
                log.info("pipeline: %s; again", exc)
                await asyncio.sleep(0.2)
        self.record.pipeline_documents = len(docs)

    async def _all_finished(self, broker: Any) -> bool:
        try:
            stats = await broker.stats()
        except BrokerError:
            return False
        active: int = sum(
            s.counts.get(JobStatus.PENDING, 0) + s.counts.get(JobStatus.PROCESSING, 0)
            for s in stats
        )
        return active == 0

    async def run(self) -> Report:
        try:
            if self.net is not None:
                await asyncio.to_thread(self.net.open)
            return await self._run()
        finally:
            # Also on Ctrl-C (the task is cancelled): no namespace, veth or pump is left.
            if self.net is not None:
                self.net.close()

    async def _run(self) -> Report:
        from chaos.app import app as chaos_app

        self.record.started = time.time()
        await asyncio.to_thread(self.backend.start)
        self._start_simulator()
        self.fleet = self._start_fleet()
        producer = App(broker=self.backend.broker(), database_url=self.backend.sql().url)
        producer.include(chaos_app)
        self.producer = producer
        self.record.eval_batch = f"chaos-{self.cfg.seed}" if self.cfg.eval_docs else None
        if self.cfg.pipeline_docs:
            self.record.pipeline_batch = f"chaos-pipe-{self.cfg.seed}"
        try:
            await producer.open()
            if self.net is None:
                await self._enqueue(producer)
            broker = producer.broker
            for _ in range(self.cfg.workers):
                self._spawn()
            if self.net is not None:
                # The jobs come once every worker is serving: a worker still importing
                # cuts nothing, and one that claims jobs while the others start (two
                # cores, three interpreters) can miss a 3 s lease with no fault at all.
                await self._workers_ready()
                await self._enqueue(producer)
            plan = self._plan_evals(self._schedule())
            t0 = time.monotonic()
            log.info("chaos %s: %d jobs, faults %s", self.backend.name, self.cfg.jobs, plan)
            while plan or self.heals or time.monotonic() - t0 < self.cfg.fault_phase:
                self._continue_due()
                self._heal_due()
                self._reap_and_replace()
                if plan and time.monotonic() - t0 >= plan[0][0] and not self._held_back():
                    await self._inject(plan.pop(0)[1], broker)
                    continue
                await asyncio.sleep(0.1)
            # Drain: no more faults; every stopped worker continues; servers up.
            self._continue_due(force=True)
            self._heal_due(force=True)
            await asyncio.to_thread(self.backend.ensure_running)
            await self._snapshot_leases(broker)
            drain_start = time.monotonic()
            while time.monotonic() - drain_start < self.cfg.drain_timeout:
                self._reap_and_replace()
                if await self._all_finished(broker):
                    self.record.drained = True
                    break
                await asyncio.sleep(0.25)
            self.record.drain_seconds = time.monotonic() - drain_start
            await self._stop_workers()
            if self.record.eval_batch is not None:
                # What `herd eval status` does first: items deduplicated onto a job
                # that finished meanwhile take its result.
                await settle(producer, self.record.eval_batch)
            if self.record.pipeline_batch is not None:
                # As `herd eval status` does: pieces dead-lettered by stalls counted.
                await batch_status(producer, self.record.pipeline_batch)
            sim = self._simulator_records()
            self.record.ended = time.time()
            (self.dir / "record.json").write_text(json.dumps(asdict(self.record), indent=1))
            return await check(self.backend, broker, self.record, sim, self.dir)
        finally:
            await producer.close()
            self._cleanup()

    async def _snapshot_leases(self, broker: Any) -> None:
        """Who holds the unexpired leases now, and is that process alive?"""
        try:
            jobs = await broker.list_jobs(status=JobStatus.PROCESSING, limit=100_000)
        except BrokerError as exc:
            log.warning("no lease snapshot: %s", exc)
            return
        now = datetime.now(UTC)
        for j in jobs:
            if j.lease_expires_at is None or j.lease_expires_at <= now:
                continue
            pid = pid_of_owner(j.lease_owner)
            self.record.lease_snapshot.append(
                {"job": j.id, "pid": pid, "alive": pid is not None and alive(pid), "t": time.time()}
            )

    async def _stop_workers(self) -> None:
        self._reap_and_replace(replace=False)
        assert self.fleet is not None
        for p in self.procs:
            if p.signalled is None:
                p.signalled = "drain"
                self.fleet.terminate(p.pid)
        for p in self.procs:
            try:
                code: int | None = await asyncio.to_thread(p.popen.wait, 60)
            except subprocess.TimeoutExpired:
                code = None
            if p.signalled == "drain":
                self.record.drain_exit_codes[p.pid] = code
            elif p.fault is not None and p.fault.get("until") is None:
                p.fault["until"] = time.time()

    def _simulator_records(self) -> dict[str, Any]:
        with httpx.Client(base_url=self.sim_url, timeout=30) as client:
            stats = client.get("/_sim/stats").json()
            calls = client.get("/_sim/calls").json()
        data: dict[str, Any] = {"stats": stats, "calls": calls}
        if self.eval_sim_url:
            with httpx.Client(base_url=self.eval_sim_url, timeout=30) as client:
                data["eval"] = {"stats": client.get("/_sim/stats").json()}
        (self.dir / "simulator.json").write_text(json.dumps(data))
        return data

    def _cleanup(self) -> None:
        if self.fleet is not None:
            self.fleet.close()
        for sim in (self.sim, self.eval_sim):
            if sim is not None:
                sim.stop()
        self._faults_file.close()
        try:
            self.backend.stop()
        except Exception as exc:  # a stop that fails must not hide the run's own outcome
            log.warning("could not stop the chaos %s server: %s", self.backend.name, exc)


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    """These environment variables set for the block, then as they were."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


async def run_chaos(config: ChaosConfig) -> Report:
    return await Harness(config).run()


__all__ = ["ChaosConfig", "Harness", "PostgresBackend", "RedisBackend", "run_chaos"]
