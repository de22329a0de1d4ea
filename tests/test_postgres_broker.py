"""What only the PostgreSQL broker does: retention of succeeded jobs (Redis expires
a succeeded job's hash after the same ``finished_ttl``)."""

from __future__ import annotations

import asyncio
import os
import re
import socket

import psycopg
import pytest
from psycopg import sql

from herd import App, Worker
from herd.errors import BrokerError
from herd.queue.base import Completion, Failure, JobStatus, NewJob
from herd.queue.postgres import PostgresBroker, _claim_statement
from tests.helpers import count_checkout_checks, drop_connections, eventually, own_connections


async def test_succeeded_jobs_past_retention_are_purged_and_dead_ones_kept(clean_pg):
    broker = PostgresBroker(clean_pg, finished_ttl=3600)
    await broker.open()
    try:
        made = await broker.enqueue([NewJob(task="t", payload={"n": n}) for n in range(4)])
        ids = [m.job_id for m in made]
        leases = {lease.job_id: lease for lease in await broker.claim(["default"], "w", 4)}
        assert (
            await broker.complete_if_leased([Completion(leases[i], "ok") for i in ids[:3]])
            == [True] * 3
        )
        assert await broker.fail_if_leased(Failure(leases[ids[3]], "no", final=True)) == (
            JobStatus.DEAD
        )
        old, kept, later, dead = ids
        with psycopg.connect(clean_pg, autocommit=True) as conn:
            conn.execute(
                "UPDATE herd_jobs SET finished_at = now() - interval '2 hours' WHERE id = ANY(%s)",
                ([old, later, dead],),
            )
            conn.execute(
                "UPDATE herd_jobs SET finished_at = now() - interval '59 minutes' WHERE id = %s",
                (kept,),
            )
        assert await broker.purge_finished(batch=1) == 2  # batches until none is left
        assert await broker.get_job(old) is None and await broker.get_job(later) is None
        assert (await broker.get_job(kept)).status == JobStatus.SUCCEEDED
        assert (await broker.get_job(dead)).status == JobStatus.DEAD  # the DLQ is never purged
    finally:
        await broker.close()


async def test_workers_purge_without_being_asked(clean_pg):
    broker = PostgresBroker(clean_pg, finished_ttl=60)
    await broker.open()
    try:
        (made,) = await broker.enqueue([NewJob(task="t", payload={})])
        (lease,) = await broker.claim(["default"], "w", 1)
        assert await broker.complete_if_leased([Completion(lease, "ok")]) == [True]
        with psycopg.connect(clean_pg, autocommit=True) as conn:
            conn.execute("UPDATE herd_jobs SET finished_at = now() - interval '1 hour'")
    finally:
        await broker.close()
    # Another process's broker purges as part of claiming, in the background.
    other = PostgresBroker(clean_pg, finished_ttl=60)
    await other.open()
    try:
        assert await other.claim(["default"], "w2", 1) == []

        async def gone() -> bool:
            return await other.get_job(made.job_id) is None

        await eventually(gone)
    finally:
        await other.close()


Counts = dict[tuple[str, str], int]


def _counters(url: str) -> tuple[Counts, Counts, set[int]]:
    """(counts summed over slots, a full count of herd_jobs, the slots in use)."""
    with psycopg.connect(url, autocommit=True) as conn:
        kept = conn.execute(
            "SELECT queue, status, sum(n) FROM herd_job_counts GROUP BY 1, 2 HAVING sum(n) <> 0"
        ).fetchall()
        full = conn.execute(
            "SELECT queue, status, count(*) FROM herd_jobs GROUP BY 1, 2"
        ).fetchall()
        slots = conn.execute("SELECT DISTINCT slot FROM herd_job_counts").fetchall()
    return (
        {(q, s): int(n) for q, s, n in kept},
        {(q, s): int(n) for q, s, n in full},
        {int(slot) for (slot,) in slots},
    )


async def test_counts_stay_exact_under_concurrent_workers_and_fold_into_one_slot(clean_pg):
    broker = PostgresBroker(clean_pg, pool_size=24)
    await broker.open()
    try:
        await broker.enqueue([NewJob(task="t", payload={}, queue=f"q{i % 2}") for i in range(400)])

        async def work(n: int) -> None:
            while leases := await broker.claim(["q0", "q1"], f"w{n}", 5):
                done = [lease for lease in leases if lease.job_id % 7]
                await broker.complete_if_leased([Completion(lease, n) for lease in done])
                for lease in leases:
                    if lease.job_id % 7 == 0:  # half retried, half dead-lettered
                        final = lease.job_id % 2 == 0
                        await broker.fail_if_leased(Failure(lease, "x", final=final))

        # Twenty claimers on as many connections: the slots of one counter are written
        # side by side, and the sums must still equal a full count.
        await asyncio.gather(*(work(n) for n in range(20)))
        kept, full, slots = _counters(clean_pg)
        assert kept == full and sum(full.values()) == 400
        stats = await broker.stats()
        assert {(s.queue, st.value): n for s in stats for st, n in s.counts.items()} == full
        assert len(slots) > 1  # the connections wrote slots of their own
        await broker.fold_counts()
        kept, full, slots = _counters(clean_pg)
        assert kept == full and slots == {0}
    finally:
        await broker.close()


async def test_truncating_the_job_table_resets_its_counts_and_throughput(clean_pg):
    broker = PostgresBroker(clean_pg)
    await broker.open()
    try:
        await broker.enqueue([NewJob(task="t", payload={})])
        (lease,) = await broker.claim(["default"], "w", 1)
        await broker.complete_if_leased([Completion(lease, None)])
        assert sum((await broker.throughput(2)).succeeded["default"]) == 1
        with psycopg.connect(clean_pg, autocommit=True) as conn:
            conn.execute("TRUNCATE herd_jobs")
        assert await broker.stats() == []
        assert (await broker.throughput(2)).succeeded == {}
    finally:
        await broker.close()


async def test_the_throughput_rollup_is_kept_for_its_own_ttl(clean_pg):
    broker = PostgresBroker(clean_pg, throughput_ttl=3600)
    await broker.open()
    try:
        await broker.enqueue([NewJob(task="t", payload={}) for _ in range(2)])
        for lease in await broker.claim(["default"], "w", 2):
            await broker.complete_if_leased([Completion(lease, None)])
        with psycopg.connect(clean_pg, autocommit=True) as conn:
            conn.execute("UPDATE herd_job_throughput SET minute = minute - interval '2 hours'")
            conn.execute(
                "INSERT INTO herd_job_throughput VALUES (date_trunc('minute', now()), 'default',"
                " 'succeeded', 3, 5)"
            )
        assert await broker._purge_quietly() == 0
        with psycopg.connect(clean_pg, autocommit=True) as conn:
            rows = conn.execute("SELECT n FROM herd_job_throughput").fetchall()
        assert rows == [(5,)]
    finally:
        await broker.close()


def _rows_read(plan: dict, table: str) -> int:
    """Rows a plan (EXPLAIN ANALYZE, JSON) read from ``table``, filtered ones included."""
    own = 0
    if plan.get("Relation Name") == table:
        loops = plan.get("Actual Loops", 1)
        own = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
    return own + sum(_rows_read(p, table) for p in plan.get("Plans", []))


def _ready_by_count(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT queue, count(*) FILTER (WHERE run_at <= now()) FROM herd_jobs"
            " WHERE status = 'pending' GROUP BY queue"
        ).fetchall()
    return {q: n for q, n in rows}


async def test_ready_counts_come_from_the_counters_not_from_the_pending_rows(clean_pg):
    broker = PostgresBroker(clean_pg)
    await broker.open()
    try:
        await broker.enqueue([NewJob(task="t", payload={}) for _ in range(1500)])
        later = await broker.enqueue(
            [NewJob(task="t", payload={}, delay=3600) for _ in range(300)]
            + [NewJob(task="t", payload={}, queue="other", delay=600) for _ in range(40)]
        )
        leases = await broker.claim(["default"], "w", 4)
        # Into the future by a retry and by a release; back to now by a reschedule.
        assert await broker.fail_if_leased(Failure(leases[0], "x", retry_in=900)) is not None
        assert len(await broker.release_if_leased(leases[1:2], delay=900)) == 1
        assert len(await broker.reschedule([m.job_id for m in later[:25]], 0)) == 25
        with psycopg.connect(clean_pg, autocommit=True) as conn:  # their time has come
            conn.execute(
                "UPDATE herd_jobs SET run_at = now() - interval '1 second' WHERE id = ANY(%s)",
                ([m.job_id for m in later[25:35]],),
            )
        ready = {s.queue: s.ready for s in await broker.stats()}
        assert ready == {"default": 1496 + 25 + 10, "other": 0} == _ready_by_count(clean_pg)
        (head,) = [s for s in await broker.stats() if s.queue == "default"]
        assert head.oldest_ready_age is not None and head.oldest_ready_age >= 0

        # However long the backlog, stats() reads the head of the line only: the two jobs
        # put off by the retry and the release (ids 1 and 2, first in the claim order,
        # skipped as a claim skips them) and the first ready one; not the 1,800 pending.
        with psycopg.connect(clean_pg) as conn:
            sql = broker._q["stats"]
            ((plan,),) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql).fetchall()
        assert _rows_read(plan[0]["Plan"], "herd_jobs") == 3
    finally:
        await broker.close()


async def test_a_delayed_job_counts_as_ready_once_its_time_has_come(clean_pg):
    broker = PostgresBroker(clean_pg)
    await broker.open()
    try:
        await broker.enqueue([NewJob(task="t", payload={}, delay=0.5)])
        (s,) = await broker.stats()
        assert s.ready == 0 and s.counts == {JobStatus.PENDING: 1}

        async def ready() -> bool:
            (s,) = await broker.stats()
            return s.ready == 1

        await eventually(ready)  # at most a second after its run_at
        (lease,) = await broker.claim(["default"], "w", 1)
        assert await broker.complete_if_leased([Completion(lease, None)]) == [True]
        (s,) = await broker.stats()
        assert s.ready == 0 and s.counts == {JobStatus.SUCCEEDED: 1}
    finally:
        await broker.close()


async def test_a_keys_counters_go_once_its_work_is_done_and_come_back_with_new_work(clean_pg):
    broker = PostgresBroker(clean_pg)
    await broker.open()
    try:
        jobs = [NewJob("t", {}, concurrency_key=f"k{i % 50}", max_running_per_key=2)
                for i in range(100)]  # fmt: skip
        await broker.enqueue(jobs)
        leases = await broker.claim(["default"], "w", 40)
        # The first claim's retention pass prunes idle keys too: let it end before any
        # key's work does, so that what is counted below is this test's doing.
        assert broker._purging is not None
        await broker._purging
        while leases:
            assert all(await broker.complete_if_leased([Completion(x, 1) for x in leases]))
            leases = await broker.claim(["default"], "w", 40)
        with psycopg.connect(clean_pg) as conn:
            assert conn.execute("SELECT count(*) FROM herd_key_counts").fetchone() == (50,)
            assert await broker.prune_keys() == 50
            for table in ("herd_key_counts", "herd_key_released"):
                assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
        await broker.enqueue(jobs[:1])
        (k,) = await broker.key_stats()
        assert (k.key, k.running, k.waiting, k.max_running) == ("k0", 0, 1, 2)
    finally:
        await broker.close()


async def test_a_workers_verbs_skip_the_checkout_check_yet_survive_dropped_connections(
    clean_pg, monkeypatch
):
    url, tag = own_connections(clean_pg)
    broker = PostgresBroker(url, pool_size=2)
    await broker.open()
    checks = count_checkout_checks(monkeypatch)
    try:
        await broker.enqueue([NewJob(task="t", payload={}, lease_seconds=30.0) for _ in range(12)])
        (first,) = await broker.claim(["default"], "w", 1)
        assert await broker.complete_if_leased([Completion(first, None)]) == [True]
        await broker._purging  # the first claim's retention pass: statements of its own
        checks.clear()
        for _ in range(5):  # claims, renewals and completions on connections just used
            (lease,) = await broker.claim(["default"], "w", 1)
            assert lease.job_id in await broker.renew_if_leased([lease])
            assert await broker.complete_if_leased([Completion(lease, None)]) == [True]
        assert checks == []
        # The server drops every connection of the pool: the next claim and completion
        # land all the same (sent again on a checked connection), and a fenced
        # transaction is still checked before it starts (tests/chaos/test_findings.py).
        (lease,) = await broker.claim(["default"], "w", 1)
        drop_connections(clean_pg, tag)
        assert await broker.complete_if_leased([Completion(lease, None)]) == [True]
        assert len(await broker.claim(["default"], "w", 1)) == 1
        assert checks  # the second tries were checked
    finally:
        await broker.close()


async def test_a_drain_writes_each_result_in_the_statement_of_a_claim(clean_pg, monkeypatch):
    # One commit (one WAL flush) for a claim and the results of the jobs whose slots it
    # fills: no completion is written alone while the worker claims.
    broker = PostgresBroker(clean_pg)
    sent: list[str] = []
    execute = psycopg.AsyncCursor.execute

    async def counting(self, query, params=None, **kw):
        sent.append(query)
        return await execute(self, query, params, **kw)

    app = App(broker=broker)

    @app.task(name="noop")
    async def noop(payload):
        return payload

    async with app:
        ids = [r.job_id for r in await app.enqueue_many("noop", list(range(200)))]
        monkeypatch.setattr(psycopg.AsyncCursor, "execute", counting)
        worker = Worker(
            app,
            concurrency=10,
            poll_interval=0.05,
            stop_when_idle=True,
            install_signal_handlers=False,
        )
        stats = await asyncio.wait_for(worker.run(), 60)
        monkeypatch.undo()
        jobs = await broker.get_jobs(ids)
    assert stats.succeeded == 200 and {j.result for j in jobs} == set(range(200))
    alone = [q for q in sent if q == broker._q["complete"]]
    claims = {text for name, text in broker._q.items() if name.startswith("complete_and_claim@")}
    with_claims = [q for q in sent if isinstance(q, str) and q in claims]
    assert alone == [] and with_claims


async def test_a_claim_reads_a_few_rows_whatever_the_keyed_backlog(clean_pg):
    broker = PostgresBroker(clean_pg)
    await broker.open()
    try:
        backlog = [NewJob("t", {}, concurrency_key=f"k{i % 20}", max_running_per_key=1000)
                   for i in range(2000)]  # fmt: skip
        await broker.enqueue(backlog + [NewJob("t", {}) for _ in range(5)])
        with psycopg.connect(clean_pg, autocommit=True) as conn:
            # As autovacuum would have by now: the jobs and the keys' counters, whose
            # statistics the claim's plan reads too (with herd_key_counts left to
            # autovacuum's timing, a run read 260 rows).
            conn.execute("ANALYZE herd_jobs, herd_key_counts")
            # The plan the broker's claim runs on: the generic one (see the next test).
            plan = _generic_plan(conn, broker._q[_claim_statement(broker._q, "claim", 5)],
                                 {"queue": "default", "owner": "w", "live": None})  # fmt: skip
        # The jobs without a key are found along their own index, not past the 2,000
        # keyed ones: a few jobs of each of the 20 keys, 5 free jobs, the 5 taken (260
        # rows read with both tables analysed, 80 with herd_key_counts never analysed,
        # which made this test's bound of 100 depend on autovacuum's timing; 2,080 along
        # herd_jobs_ready).
        assert _rows_read(plan[0]["Plan"], "herd_jobs") <= 300
    finally:
        await broker.close()


async def test_a_claim_is_planned_once_per_connection_not_on_every_claim(clean_pg):
    """With its limit a parameter, PostgreSQL planned the claim anew on every call (a
    generic plan reads ``LIMIT $1`` as a tenth of the table): half a millisecond of a
    claim's 0.8, an empty one's too. The broker's text carries the limit, and after
    the first few calls the server keeps one plan."""
    broker = PostgresBroker(clean_pg)
    await broker.open()
    try:
        # A backlog of some size: on a few dozen rows either plan costs the same.
        keyed = [NewJob("t", {}, concurrency_key=f"k{i % 3}", max_running_per_key=1)
                 for i in range(3000)]  # fmt: skip
        await broker.enqueue(keyed + [NewJob("t", {}) for _ in range(3000)])
        sql = broker._q[_claim_statement(broker._q, "claim", 2)]
        with psycopg.connect(clean_pg, autocommit=True) as conn:
            conn.execute("ANALYZE herd_jobs, herd_key_counts")
            for _ in range(20):  # psycopg prepares a statement on its 5th run
                conn.execute(sql, {"queue": "default", "owner": "w", "live": None})
            ((generic, custom),) = conn.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE 'WITH ready AS%%'"
            ).fetchall()
        assert generic >= 10 and custom <= 5, (generic, custom)
    finally:
        await broker.close()


async def test_a_claim_on_a_large_backlog_reads_a_few_rows_on_its_generic_plan(clean_pg):
    """The generic plan knows no queue: with 20,000 ready jobs in one queue and a few in
    another, a claim of either walks its index, never the backlog (a sort of every
    ready job would be O(backlog) on every claim)."""
    broker = PostgresBroker(clean_pg)
    await broker.open()
    try:
        for start in range(0, 20_000, 5_000):
            await broker.enqueue([NewJob("t", {}, queue="big") for _ in range(5_000)])
        await broker.enqueue([NewJob("t", {}, queue="small") for _ in range(5)])
        with psycopg.connect(clean_pg, autocommit=True) as conn:
            conn.execute("ANALYZE herd_jobs, herd_key_counts")
            sql = broker._q[_claim_statement(broker._q, "claim", 5)]
            for queue in ("big", "small"):
                plan = _generic_plan(conn, sql, {"queue": queue, "owner": "w", "live": None})
                assert _rows_read(plan[0]["Plan"], "herd_jobs") <= 50, queue
    finally:
        await broker.close()


def _generic_plan(conn: psycopg.Connection, statement: str, params: dict) -> list:
    """EXPLAIN ANALYZE of ``sql`` on the plan PostgreSQL keeps for a prepared statement
    whatever its values (its generic plan), run with ``params``."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    text = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", statement)
    conn.execute(f"PREPARE herd_generic AS {text}".replace("%%", "%"))
    try:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        args = sql.SQL(", ").join(sql.Literal(params[n]) for n in names)
        query = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE herd_generic({})").format(args)
        ((plan,),) = conn.execute(query).fetchall()
        return plan
    finally:
        conn.execute("RESET plan_cache_mode")
        conn.execute("DEALLOCATE herd_generic")


async def test_the_busiest_keys_are_read_without_ranking_every_key_with_work(clean_pg):
    """3,000 keys with work: the dashboard's busiest 5 read a few rows of the counters
    (it sorted every key with work on each poll), and are the same 5 as that sort's."""
    broker = PostgresBroker(clean_pg)
    await broker.open()
    try:
        # Running: two jobs of k7, one of k9.
        await broker.enqueue([NewJob("t", {}, concurrency_key=k, max_running_per_key=2)
                              for k in ("k7", "k7", "k9")])  # fmt: skip
        assert len(await broker.claim(["default"], "w", 3)) == 3
        # Waiting: a job of every key, and 1, 2 and 3 more of k1, k2 and k3.
        jobs = [NewJob("t", {"i": i}, concurrency_key=f"k{i}", max_running_per_key=2)
                for i in range(3000)]  # fmt: skip
        jobs += [NewJob("t", {}, concurrency_key=f"k{i}", max_running_per_key=2)
                 for i in range(1, 4) for _ in range(i)]  # fmt: skip
        await broker.enqueue(jobs)
        top = [(k.key, k.running, k.waiting) for k in await broker.key_stats(5)]
        assert top == [("k3", 0, 4), ("k2", 0, 3), ("k7", 2, 1), ("k1", 0, 2), ("k9", 1, 1)]
        with psycopg.connect(clean_pg, autocommit=True) as conn:
            conn.execute("ANALYZE herd_jobs, herd_key_counts")
            sql = "EXPLAIN (ANALYZE, FORMAT JSON) " + broker._q["key_stats"]
            ((plan,),) = conn.execute(sql, {"limit": 5}).fetchall()
        assert _rows_read(plan[0]["Plan"], "herd_key_counts") <= 50
    finally:
        await broker.close()


@pytest.mark.parametrize("through", ["server", "pgbouncer"])
async def test_a_fenced_transaction_left_idle_past_its_lease_ends_and_its_job_is_taken_over(
    clean_pg, request, through
):
    """A worker cut off (or frozen) inside a fenced transaction: its row lock kept the job
    out of every claim until the server's TCP keepalive gave up, two hours later. The
    server now ends the idle transaction once the lease's length has passed; the job is
    taken over and the stalled transaction's writes never land."""
    url = clean_pg if through == "server" else request.getfixturevalue("pgbouncer_url")
    broker = PostgresBroker(url, pool_size=3)
    await broker.open()
    try:
        await broker.enqueue([NewJob(task="t", payload={}, lease_seconds=1.0)])
        (lease,) = await broker.claim(["default"], "w1", 1)
        inside, go_on = asyncio.Event(), asyncio.Event()

        async def stalled() -> None:
            async with broker.fenced_transaction(lease) as conn:
                inside.set()
                await go_on.wait()  # the client says nothing more: cut off, frozen
                await conn.execute("UPDATE herd_jobs SET payload = '{\"late\": 1}'")

        task = asyncio.create_task(stalled())
        await inside.wait()
        taken = await eventually(lambda: broker.claim(["default"], "w2", 1), timeout=20)
        assert [t.job_id for t in taken] == [lease.job_id]
        assert taken[0].token > lease.token
        go_on.set()
        with pytest.raises(BrokerError):
            await task
        assert (await broker.get_job(lease.job_id)).payload == {}
    finally:
        await broker.close()


async def test_every_herd_session_bounds_an_idle_transaction_and_keeps_the_urls_options(
    clean_pg, monkeypatch
):
    """Any herd transaction, not only a fenced one: a session idle inside one (its client
    gone between two statements) is ended by the server, and its row locks with it. The
    bound is added to the options a URL carries, not put in their place."""
    monkeypatch.setattr("herd.db.postgres.IDLE_IN_TRANSACTION", 1.0)
    sep = "&" if "?" in clean_pg else "?"
    broker = PostgresBroker(f"{clean_pg}{sep}options=-c%20search_path%3Dpublic", pool_size=3)
    await broker.open()
    try:
        async with broker._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT current_setting('idle_in_transaction_session_timeout'),"
                " current_setting('search_path')"
            )
            assert await cur.fetchone() == ("1s", "public")
        await broker.enqueue([NewJob(task="t", payload={}, lease_seconds=30.0)])
        inside, go_on = asyncio.Event(), asyncio.Event()

        async def stalled() -> None:
            async with broker._pool.connection() as conn, conn.transaction():
                await conn.execute("SELECT id FROM herd_jobs FOR UPDATE")
                inside.set()
                await go_on.wait()

        task = asyncio.create_task(stalled())
        await inside.wait()
        assert await eventually(lambda: broker.claim(["default"], "w", 1), timeout=20)
        go_on.set()
        with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
            await task
    finally:
        await broker.close()


async def test_a_connection_over_tcp_gives_up_on_a_link_gone_dead(pgbouncer_url):
    """A statement sent into a dead link waited on its reply for as long as the kernel
    retransmitted (~15 min), a worker's task or heartbeat with it: every herd connection's
    socket now gives up after 30 s unacknowledged or 10 + 3 x 5 s of unanswered probes.
    Through PgBouncer: the suite's only TCP link (the embedded server listens on a Unix
    socket). What the URL sets itself wins."""
    sep = "&" if "?" in pgbouncer_url else "?"
    broker = PostgresBroker(f"{pgbouncer_url}{sep}keepalives_idle=99", pool_size=2)
    await broker.open()
    try:
        async with broker._pool.connection() as conn:
            with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30_000
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 99
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 5
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
    finally:
        await broker.close()
