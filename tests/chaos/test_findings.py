"""What the chaos runs found in herd's core, each as a minimal reproduction.

A finding that is still open is marked ``xfail(strict=True)``: the test documents
the behaviour, and turns red (XPASS) once the core is fixed, so the mark comes off.

Fixed: the pool handed out connections the server had closed (no check on
checkout), so a fenced write failed after a restart or a dropped connection
although the lease was held; the job was retried and its model call paid again.
"""

from __future__ import annotations

import psycopg

from herd.queue.base import NewJob
from herd.queue.postgres import PostgresBroker


async def test_a_fenced_write_after_the_servers_connections_were_dropped_succeeds(clean_pg):
    broker = PostgresBroker(clean_pg, pool_size=2)
    await broker.open()
    try:
        await broker.enqueue([NewJob(task="t", payload={}, lease_seconds=30.0)])
        (lease,) = await broker.claim(["default"], "w", 1)
        # The server cuts every connection of this broker (a restart, a failover, an
        # idle timeout, pg_terminate_backend): the server itself stays up.
        with psycopg.connect(clean_pg, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        # The lease is still held (30 s): the job's fenced write should land.
        async with broker.fenced_transaction(lease) as conn:
            await conn.execute("SELECT 1")
    finally:
        await broker.close()
