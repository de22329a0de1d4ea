"""The worker: claim, heartbeat, run, write back fenced; shut down without losing work.

One asyncio loop per process runs these:
  * the claim loop, which takes up to ``concurrency`` jobs per round trip and
    sleeps on LISTEN/NOTIFY (a hint) or a jittered poll (the safety net);
  * the heartbeat, which renews every lease this process holds in ONE
    statement per tick and cancels the task of any lease it could not renew;
  * beside the leases, a liveness mark held by the job store on a connection of
    its own (Broker.hold_liveness): when this process is killed the server drops
    it, and other workers take its jobs over at once instead of after the lease;
  * finished jobs' results, which go with the claim loop's next claim (the one
    that refills their slots: one statement, one commit for both); while claims
    have stopped (shutdown, an outage) the completer writes them in batches
    (whatever finished while the previous write was in flight);
  * one coroutine per running job. Sync task functions run in threads, so a
    task that blocks the CPU cannot starve the heartbeat.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import random
import signal
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from herd import aio, telemetry
from herd.app import App
from herd.context import JobContext, call_task
from herd.errors import (
    BrokerError,
    BrokerUnavailable,
    Fatal,
    LeaseLost,
    NotJSONSerializable,
    Retry,
    Snooze,
)
from herd.jsonvalue import check
from herd.masking import mask
from herd.queue.base import Completion, DeadReason, Failure, JobStatus, Lease
from herd.schedule.ticker import Ticker

log = logging.getLogger("herd.worker")


@dataclass
class _Running:
    lease: Lease
    ctx: JobContext
    deadline: float  # monotonic time after which we must assume the lease is gone
    span: telemetry.Run
    task: asyncio.Task[None] | None = None
    lost: bool = False
    releasing: bool = False
    # Set once the result or failure is handed to the store: from then on the write's
    # own answer says whether the lease held. A renewal refused meanwhile only means
    # the write landed first (the job is finished), not that another worker has it.
    writing: bool = False


@dataclass
class WorkerStats:
    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    lost: int = 0  # leases lost while running: task cancelled, nothing written
    refused: int = 0  # writes the broker refused because the lease was stale
    snoozed: int = 0  # handed back by herd.Snooze: no attempt counted
    heartbeats: int = 0
    renew_statements: int = 0

    def __str__(self) -> str:
        """What a log line shows: the job counts that are not zero, in words."""
        jobs = ("claimed", "succeeded", "retried", "dead", "lost", "refused", "snoozed")
        return ", ".join(f"{n} {name}" for name in jobs if (n := getattr(self, name))) or "no jobs"


@dataclass
class Worker:
    app: App
    queues: Sequence[str] = ("default",)
    concurrency: int = 10
    poll_interval: float = 1.0
    grace_period: float = 30.0
    name: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    )
    install_signal_handlers: bool = True
    stop_when_idle: bool = False  # for demos and batch runs: exit once the queues are drained
    # With stop_when_idle, pending jobs due later than this are not waited for: under a
    # parked batch's recheck (60 s), above the first retries' backoff.
    idle_horizon: float = 30.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.app.pool_size(self.concurrency)  # a job per connection, and spares
        self.stats = WorkerStats()
        self._running: dict[int, _Running] = {}
        self._stopping = asyncio.Event()
        self._release_now = asyncio.Event()
        self._slot_freed = asyncio.Event()
        # A keyed job ended: its key has room again, which no NOTIFY announces.
        self._key_freed = asyncio.Event()
        # Results waiting to be written: the claim loop sends them with its next claim
        # (woken by _to_send); the completer writes them while claims have stopped.
        self._completions: list[tuple[Completion, asyncio.Future[bool]]] = []
        self._to_send = asyncio.Event()
        self._completion_ready = asyncio.Event()
        self._claimer_writes = False
        self._threads = ThreadPoolExecutor(
            max_workers=self.concurrency * 2, thread_name_prefix="herd-task"
        )

    # -- control

    def stop(self, *, immediate: bool = False) -> None:
        """Stop claiming; running jobs get the grace period (none if immediate)."""
        if self._stopping.is_set() or immediate:
            self._release_now.set()
        self._stopping.set()

    def _on_signal(self, signum: int) -> None:
        if self._stopping.is_set():
            log.warning("second %s: releasing running jobs now", signal.Signals(signum).name)
        else:  # the normal way to stop a worker: nothing is wrong
            log.info(
                "%s: no new jobs; %d running get %.0fs to finish (again to release now)",
                signal.Signals(signum).name,
                len(self._running),
                self.grace_period,
            )
        self.stop(immediate=self._stopping.is_set())

    async def run(self) -> WorkerStats:
        await self.app.open()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT) if self.install_signal_handlers else ()
        for sig in signals:
            loop.add_signal_handler(sig, self._on_signal, sig)
        helpers = [
            asyncio.create_task(self._heartbeat(), name="herd-heartbeat"),
            asyncio.create_task(self._completer(), name="herd-completer"),
        ]
        if self.app.schedules:  # every worker ticks; the store lets one fire each tick
            ticker = Ticker(self.app).run(self._stopping)
            helpers.append(asyncio.create_task(ticker, name="herd-schedules"))
        log.info(
            "worker %s: queues %s, concurrency %d",
            self.name,
            ",".join(self.queues),
            self.concurrency,
        )
        try:
            # Before the first claim: a claim records the mark with each job, and
            # others take a job over at once when its owner's mark is gone.
            await self.app.broker.hold_liveness(self.name)
            await self._claim_loop()
            await self._drain()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            await aio.stop(*helpers)
            self._threads.shutdown(wait=False, cancel_futures=True)
            # After the drain gave the jobs back: a mark dropped earlier would let
            # others take over jobs still running here.
            try:
                await self.app.broker.release_liveness(self.name)
            except BrokerError as exc:
                log.warning("could not drop the liveness mark: %s", exc)
        log.info("worker %s stopped: %s", self.name, self.stats)
        return self.stats

    # -- claiming

    async def _claim_loop(self) -> None:
        failures = 0
        self._claimer_writes = True
        try:
            while not self._stopping.is_set():
                # A job whose result waits in the buffer has ended: its slot is free
                # for this claim, which writes the result too (one commit for both).
                free = self.concurrency - len(self._running) + len(self._completions)
                if free <= 0:
                    self._slot_freed.clear()
                    self._to_send.clear()
                    await self._until(self._slot_freed.wait(), self._to_send.wait())
                    continue
                batch, self._completions = self._completions, []
                try:
                    sent = time.time_ns()
                    oks, leases = await self.app.broker.complete_and_claim(
                        [c for c, _ in batch], self.queues, self.name, free
                    )
                    telemetry.claimed(self.queues, self.name, sent, leases)
                except BrokerError as exc:  # unreachable, or failing: either way, back off
                    # The completer writes the results meanwhile, as each lease allows
                    # (those this call stored are found stored: already_completed).
                    self._completions = batch + self._completions
                    self._claimer_writes = False
                    self._completion_ready.set()
                    failures += 1
                    delay = min(30.0, 0.5 * 2 ** min(failures, 6)) * random.uniform(0.8, 1.2)
                    log.error("%s; retrying in %.1fs", exc, delay)
                    await self._until(asyncio.sleep(delay))
                    self._claimer_writes = True
                    continue
                except BaseException:
                    self._completions = batch + self._completions
                    raise
                _answer(batch, oks)
                if failures:
                    log.warning("job store reachable again")
                    failures = 0
                for lease in leases:
                    self._start(lease)
                if len(leases) < free:
                    if (
                        self.stop_when_idle
                        and not self._running
                        and not leases
                        and not (await self._queues_active())
                    ):
                        self.stop()
                        break
                    # Fewer jobs than slots: wait for a NOTIFY, a poll tick, a result
                    # to write, or a free slot (of a concurrency key: its waiting jobs
                    # may run now).
                    self._slot_freed.clear()
                    self._key_freed.clear()
                    self._to_send.clear()
                    if self._completions:
                        continue
                    timeout = self.poll_interval * random.uniform(0.5, 1.0)
                    await self._until(
                        self.app.broker.wait_for_jobs(self.queues, timeout),
                        (self._slot_freed if self.stop_when_idle else self._key_freed).wait(),
                        self._to_send.wait(),
                    )
        finally:
            # Results of jobs still running once claims stop: the completer's.
            self._claimer_writes = False
            self._completion_ready.set()

    async def _queues_active(self) -> bool:
        """Jobs running elsewhere (they may fail and come back), or pending and due
        within ``idle_horizon`` (a retry's backoff)? Jobs held further out, a parked
        batch's or a long backoff's, are not waited for: the worker names them and stops."""
        try:
            stats = [s for s in await self.app.broker.stats() if s.queue in self.queues]
            if any(s.counts.get(JobStatus.PROCESSING, 0) for s in stats):
                return True
            if not any(s.counts.get(JobStatus.PENDING, 0) for s in stats):
                return False
            due = await self.app.broker.next_due(self.queues)
        except BrokerUnavailable:
            return True
        if due is None or due <= self.idle_horizon:
            return due is not None
        held = sum(s.counts.get(JobStatus.PENDING, 0) for s in stats)
        log.warning(
            "stopping: nothing due within %s; %d pending jobs wait %s or more (a parked "
            "batch, a retry's backoff: `herd eval list`, `herd jobs list --status pending`)",
            _span(self.idle_horizon),
            held,
            _span(due),
        )
        return False

    async def _until(self, main: Any, *others: Any) -> None:
        """Await ``main`` (or the first of ``others``) but return early on stop."""
        waits = {asyncio.ensure_future(main), asyncio.ensure_future(self._stopping.wait())}
        waits.update(asyncio.ensure_future(other) for other in others)
        _, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for fut in pending:
            fut.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def _start(self, lease: Lease) -> None:
        self.stats.claimed += 1
        ctx = JobContext(lease=lease, app=self.app, worker_id=self.name)
        # The lease was granted at most "now" by the server; counting from the
        # moment we received it keeps our local deadline on the safe side.
        running = _Running(
            lease,
            ctx,
            deadline=time.monotonic() + lease.lease_seconds,
            span=telemetry.Run(lease, self.name),
        )
        ctx.confirm = partial(self._confirm, running)
        self._running[lease.job_id] = running
        running.task = asyncio.create_task(self._execute(running), name=f"herd-job-{lease.job_id}")

    def _finished(self, running: _Running) -> None:
        self._running.pop(running.lease.job_id, None)
        self._slot_freed.set()
        if running.lease.concurrency_key is not None:
            self._key_freed.set()

    # -- running one job

    async def _execute(self, running: _Running) -> None:
        with running.span:  # the task's own spans (model calls) are its children
            await self._run(running)

    async def _run(self, running: _Running) -> None:
        lease = running.lease
        try:
            task = self.app.tasks.get(lease.task)
            if task is None:
                await self._fail(
                    running,
                    Failure(
                        lease,
                        f"unknown task {lease.task!r}: no worker function is registered under"
                        " that name",
                        final=True,
                        reason=DeadReason.UNKNOWN_TASK,
                    ),
                )
                return
            try:
                loop = asyncio.get_running_loop()
                result = await call_task(
                    task,
                    lease.payload,
                    running.ctx,
                    # In this job's context: a sync task's spans are children of its run's.
                    lambda fn, *a, **kw: loop.run_in_executor(
                        self._threads, contextvars.copy_context().run, partial(fn, *a, **kw)
                    ),
                )
            except asyncio.CancelledError:
                if running.lost or running.releasing:
                    return  # nothing may be written: the lease is gone or being given back
                raise
            except LeaseLost:
                self._lost(running, "the task's fenced write was refused")
                return
            except Snooze as exc:
                await self._snooze(running, exc.after, str(exc))
                return
            except Retry as exc:
                failure = self._failure(running, exc, retry_in=exc.after)
                await self._fail(running, failure, asked=True)
                return
            except Fatal as exc:
                await self._fail(
                    running, self._failure(running, exc, final=True, reason=DeadReason.FATAL)
                )
                return
            except Exception as exc:
                await self._fail(running, self._failure(running, exc))
                return
            if running.lost:
                return
            try:
                settings = self.app.settings
                check(
                    result,
                    what="result",
                    max_depth=settings.max_json_depth,
                    max_bytes=settings.max_result_bytes,
                    limit_name="HERD_MAX_RESULT_BYTES",
                )
            except NotJSONSerializable as exc:
                await self._fail(
                    running,
                    Failure(
                        lease,
                        f"task returned a result herd cannot store: {exc}",
                        final=True,
                        reason=DeadReason.BAD_RESULT,
                    ),
                )
                return
            if await self._complete(running, result):
                running.span.outcome("succeeded")
                self.stats.succeeded += 1
        finally:
            self._finished(running)

    def _failure(
        self,
        running: _Running,
        exc: BaseException,
        *,
        retry_in: float | None = None,
        final: bool = False,
        reason: DeadReason | None = None,
    ) -> Failure:
        task = self.app.tasks[running.lease.task]
        running.span.failed(_describe(exc), exc)
        delay = retry_in if retry_in is not None else task.backoff.delay(running.lease.attempts + 1)
        return Failure(
            running.lease,
            # Masked before clipping: a cut must not leave half a password behind.
            error=_clip(mask(_describe(exc)), 4_000),
            traceback=_clip(mask("".join(traceback.format_exception(exc))), 64_000),
            retry_in=delay,
            final=final,
            reason=reason,
        )

    def _lost(self, running: _Running, why: str) -> None:
        if not running.lost:
            running.lost = True
            running.span.lease_lost(why)
            running.ctx.cancelled.set()
            self.stats.lost += 1
            log.warning(
                "job %d: lease lost (%s); task cancelled, nothing written",
                running.lease.job_id,
                why,
            )

    async def _fail(self, running: _Running, failure: Failure, *, asked: bool = False) -> None:
        """Record a failure; ``asked``: the task raised Retry, the normal way to wait."""
        running.writing = True
        if not failure.traceback:  # no exception: an unknown task, a result not storable
            running.span.failed(failure.error)
        status = await self._write(running, lambda: self.app.broker.fail_if_leased(failure))
        if status is not None:
            running.span.outcome("dead" if status == JobStatus.DEAD else "retry")
        if status is None:
            self.stats.refused += 1
            self._lost(running, "failure write refused")
        elif status == JobStatus.DEAD:
            self.stats.dead += 1
            log.error(
                "job %d (%s) dead-lettered: %s",
                failure.lease.job_id,
                failure.lease.task,
                failure.error,
            )
        else:
            self.stats.retried += 1
            log.log(
                logging.INFO if asked else logging.WARNING,
                "job %d (%s) %s, retry in %.1fs: %s",
                failure.lease.job_id,
                failure.lease.task,
                "asked to be retried" if asked else "failed",
                failure.retry_in,
                failure.error,
            )

    async def _snooze(self, running: _Running, after: float, why: str = "") -> None:
        """Hand the job back, due in ``after`` seconds; attempts and stalls unchanged.
        ``why``: the task's reason (a parked batch, a limit), logged with the delay."""
        running.writing = True
        lease = running.lease
        released = await self._write(
            running, lambda: self.app.broker.release_if_leased([lease], delay=after)
        )
        if released:
            running.span.outcome("snoozed")
            self.stats.snoozed += 1
            log.info(
                "job %d (%s) snoozed for %.1fs%s", lease.job_id, lease.task, after,
                f": {why}" if why else "",
            )  # fmt: skip
        elif released is not None:
            self.stats.refused += 1
            self._lost(running, "snooze refused")

    async def _write(self, running: _Running, op: Callable[[], Any]) -> Any:
        """Retry a write through connection failures while the lease may still hold."""
        failures = 0
        while True:
            try:
                return await op()
            except BrokerError as exc:
                failures += 1
                if not isinstance(exc, BrokerUnavailable) or time.monotonic() > running.deadline:
                    log.error(
                        "job %d: giving up writing (%s); the job runs again once its lease expires",
                        running.lease.job_id,
                        exc,
                    )
                    return None
                await asyncio.sleep(min(2.0, 0.1 * 2**failures))

    async def _complete(self, running: _Running, result: Any) -> bool:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        running.writing = True
        self._completions.append((Completion(running.lease, result), fut))
        self._to_send.set()
        self._completion_ready.set()
        ok = await fut
        if not ok:
            self.stats.refused += 1
            self._lost(running, "completion refused")
        return ok

    async def _completer(self) -> None:
        while True:
            await self._completion_ready.wait()
            self._completion_ready.clear()
            if self._claimer_writes:
                continue  # the claim loop sends them with its next claim
            batch, self._completions = self._completions, []
            if not batch:
                continue
            try:
                oks = await self.app.broker.complete_if_leased([c for c, _ in batch])
            except BrokerError as exc:
                now = time.monotonic()
                keep = []
                for completion, fut in batch:
                    running = self._running.get(completion.lease.job_id)
                    if running is None or now > running.deadline:
                        fut.set_result(False)
                    else:
                        keep.append((completion, fut))
                log.error("%s; %d completions wait for the job store", exc, len(keep))
                self._completions = keep + self._completions
                await asyncio.sleep(0.5)
                self._completion_ready.set()
                continue
            _answer(batch, oks)

    async def _confirm(self, running: _Running) -> None:
        """``ctx.check_lease()``: renew now unless the heartbeat renewed recently;
        during shutdown, hand the job back instead of starting a step the end of the
        grace period may cut short (another worker runs it whole, nothing is paid twice).
        """
        lease = running.lease
        if self._stopping.is_set() and not running.lost:
            running.releasing = True
            running.ctx.cancelled.set()
            try:
                await self.app.broker.release_if_leased([lease])
                log.warning("job %d handed back before its next step: shutting down", lease.job_id)
            except BrokerError as exc:
                log.error(
                    "job %d: could not hand back (%s); its lease will expire", lease.job_id, exc
                )
            raise asyncio.CancelledError  # ends the task; _execute writes nothing more
        # The heartbeat renews every third of the lease, so a held lease normally
        # has more than half of it left; less means we were paused or cut off.
        if running.deadline - time.monotonic() > lease.lease_seconds / 2 and not running.lost:
            return
        sent = time.monotonic()
        try:
            renewed = {} if running.lost else await self.app.broker.renew_if_leased([lease])
        except BrokerError:
            if time.monotonic() <= running.deadline:
                return  # unconfirmed, but not yet past our own deadline: still ours
            renewed = None
        if lease.job_id in (renewed or {}):
            running.deadline = sent + lease.lease_seconds
            return
        self._lost(running, "renewal refused" if renewed is not None else "job store unreachable")
        raise LeaseLost(f"job {lease.job_id}: the lease was lost")

    # -- heartbeat

    async def _heartbeat(self) -> None:
        # A renewal runs as a task of its own and is waited for only until the earliest
        # local deadline: cut off from the store (a partition drops packets, nothing
        # answers and nothing fails), the request would otherwise block the check that
        # cancels a job whose lease may be someone else's by now. No second renewal is
        # sent while one is pending; a late answer counts from when it was sent.
        pending: tuple[asyncio.Future[Any], float, set[int], float] | None = None
        try:
            while True:
                running = list(self._running.values())
                if not running and pending is None:
                    await asyncio.sleep(min(1.0, self.poll_interval))
                    continue
                tick = min((r.lease.lease_seconds for r in running), default=1.0) / 3
                now = time.monotonic()
                if pending is None:
                    # A lease given up as lost is never renewed again: a renewal that
                    # still lands (the store's answers were lost, not its statements)
                    # would keep the job from every other worker while the task ends.
                    leases = [r.lease for r in running if not r.lost]
                    task = asyncio.ensure_future(self.app.broker.renew_if_leased(leases))
                    longest = max((lease.lease_seconds for lease in leases), default=0.0)
                    pending = (task, now, {lease.job_id for lease in leases}, longest)
                renewal, sent, covered, longest = pending
                if not renewal.done() and now - sent > longest:
                    # Pending longer than any lease it covers: its answer could renew
                    # nothing now (a late one counts from when it was sent), and while it
                    # is pending no other goes out, so every job claimed since would be
                    # lost to it. Sent into a dead connection, it waited up to the
                    # socket's bounds (herd.db.postgres.TCP_BOUNDS) or for ever elsewhere.
                    renewal.cancel()
                    renewal.add_done_callback(_consume)
                    pending = None
                    continue
                until = min([now + tick, *(r.deadline for r in running if not r.lost)])
                await asyncio.wait({renewal}, timeout=max(0.05, until - now))
                renewed: dict[int, Any] | None = None
                answered = renewal.done()
                if answered:
                    pending = None
                    self.stats.heartbeats += 1
                    self.stats.renew_statements += 1
                    try:
                        renewed = renewal.result()
                    except BrokerError as exc:
                        log.error("heartbeat failed: %s", exc)
                now = time.monotonic()
                for r in running:
                    if r.task is None or r.task.done():
                        continue
                    if r.lost and not r.writing:
                        # Cancelled again each tick until it ends: on Python 3.11 a
                        # cancellation can be dropped (herd.aio.stop), and a task that
                        # went on would make its model calls on a lease it lost.
                        r.task.cancel()
                        continue
                    mine = r.lease.job_id in covered
                    if renewed is not None and mine and r.lease.job_id in renewed:
                        r.deadline = sent + r.lease.lease_seconds
                    elif r.writing:
                        continue  # still renewed while the write waits out an outage; never cut
                    elif (renewed is not None and mine) or now > r.deadline:
                        # Refused by the server, or unconfirmed past our own deadline:
                        # another worker may hold it now, so stop paying for this run.
                        refused = renewed is not None and mine
                        self._lost(r, "renewal refused" if refused else "job store unreachable")
                        r.task.cancel()
                if answered:
                    await asyncio.sleep(max(0.05, tick - (time.monotonic() - sent)))
        finally:
            if pending is not None:
                pending[0].cancel()

    # -- shutdown

    async def _drain(self) -> None:
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if tasks and not self._release_now.is_set():
            grace = asyncio.ensure_future(asyncio.wait(tasks, timeout=self.grace_period))
            now = asyncio.ensure_future(self._release_now.wait())
            await asyncio.wait({grace, now}, return_when=asyncio.FIRST_COMPLETED)
            for fut in (grace, now):
                fut.cancel()
        left = [r for r in self._running.values() if r.task is not None and not r.task.done()]
        for r in left:
            r.releasing = True
            r.ctx.cancelled.set()
        if left:
            # Cancelled until they end (herd.aio.stop cancels them, and again while one
            # runs on): a dropped cancellation would hold the shutdown for as long as
            # the task's model call runs.
            await aio.stop(*(r.task for r in left))
            try:
                released = await self.app.broker.release_if_leased([r.lease for r in left])
                log.warning(
                    "released %d unfinished jobs for other workers: %s", len(released), released
                )
            except BrokerUnavailable as exc:
                log.error(
                    "could not release %d jobs (%s); their leases will expire", len(left), exc
                )


def _answer(batch: Sequence[tuple[Completion, asyncio.Future[bool]]], oks: Sequence[bool]) -> None:
    """Tell each job whether the store took its result."""
    for (_, fut), ok in zip(batch, oks, strict=True):
        if not fut.done():
            fut.set_result(ok)


def _consume(fut: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned future's outcome, so that asyncio logs no error for it."""
    if not fut.cancelled():
        fut.exception()


def _describe(exc: BaseException) -> str:
    """A failure as stored and shown. herd.Retry and herd.Fatal are what the task
    asked for, which the job's status and dead reason say already: their message
    alone ("fatal: Fatal: ..." otherwise). Any other error keeps its type."""
    if isinstance(exc, Retry | Fatal) and str(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _clip(text: str, limit: int) -> str:
    """Error text for storage: no NUL (PostgreSQL text refuses it), bounded in size."""
    text = text.replace("\x00", "\\0")
    return text if len(text) <= limit else text[: limit // 2] + "\n[…]\n" + text[-limit // 2 :]


def _span(seconds: float) -> str:
    """A wait as a person reads it: a parked batch's jobs are held for years."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"
