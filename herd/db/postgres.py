"""PostgreSQL for every herd store: one pool per (event loop, URL), errors, migrations.

Each store of a process that names the same URL (the broker, the locks, the
caches, the evaluation ledger, the semantic cache, the corpus index) borrows
the same ``AsyncConnectionPool`` from here, reference-counted: the pool opens
with its first user and closes with its last, and it grows to the largest size
any of its users asked for. LISTEN for every channel goes through one shared
connection per pool as well (:class:`Listener`). So a process holds at most
``max(pool sizes asked) + 1`` connections per server, whatever it runs.

PgBouncer in transaction mode sits in front of most production servers. herd
works there: a pool detects the pooler on its first connection
(:func:`behind_pooler`) and then prepares no statements
(``prepare_threshold=None``); no store keeps session state (``set_config(...,
true)`` inside transactions, transaction-level advisory locks); LISTEN goes to
the direct URL when one is given (``HERD_DATABASE_DIRECT_URL``), else to the
pool's URL when no pooler is in between, else nowhere: notifications are hints,
and the workers' and lock waiters' polls are the net.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection, sql
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from herd.config import auto_migrate_from
from herd.db.diskfull import disk_full
from herd.errors import BrokerError, BrokerUnavailable, MigrationError
from herd.masking import mask

T = TypeVar("T")

log = logging.getLogger("herd.db")

SETTING = "HERD_DATABASE_URL"
_MIGRATION_LOCK = 0x68657264  # 'herd': one migrator at a time across processes
OPEN_TIMEOUT = 10.0


def application_name() -> str:
    """What pg_stat_activity shows for this process's connections (per pid: after a
    fork the child's connections carry its own)."""
    return f"herd:{os.getpid()}"


# Seconds the server lets a herd connection sit idle inside a transaction before it
# ends the session. herd's own transactions send their statements back to back, so an
# idle one is a client that was cut off, froze or vanished mid-transaction; until the
# server's TCP keepalive gives up (two hours by default) its row locks would keep a
# job's row, and so its takeover, out of every claim (they skip locked rows). A
# fenced transaction is bounded by its job's lease instead (check_lease).
IDLE_IN_TRANSACTION = 60.0
# The client's side of the same: a statement sent into a link that went dead would
# wait on its reply until the kernel gave up (~15 min of retransmits, two hours of
# silence without keepalives), holding a worker's task, or its heartbeat, that long.
# Unacknowledged data for TCP_USER_TIMEOUT ms, or a peer silent to the probes after
# KEEPALIVES_IDLE s, closes the connection instead; a long statement on a live
# server is not cut short (its kernel answers the probes). libpq ignores them on
# a Unix socket.
TCP_BOUNDS = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}


def idle_ms(seconds: float) -> str:
    """``seconds`` as the value of idle_in_transaction_session_timeout (ms, at least 1 s:
    0 would turn the bound off)."""
    return str(max(1000, round(seconds * 1000)))


def connect_kwargs(url: str, *, pooler: bool = False) -> dict[str, Any]:
    """Keyword arguments of every herd connection (pooled, listening, migrating).

    ``pooler``: the URL leads to a transaction pooler, where a statement prepared
    on one server connection is missing on the next: psycopg must not prepare.
    Elsewhere it prepares what repeats (a worker drains no-op jobs ~30% faster).
    Elsewhere, too, the session carries the IDLE_IN_TRANSACTION bound from its start
    (a pooler would drop the startup option, or give the setting to another client's
    session): behind one, the pooler's own bound applies (PgBouncer's
    ``idle_transaction_timeout``, docs/connections.md). Every connection, pooled or not,
    carries the TCP_BOUNDS on its socket.
    """
    given = psycopg.conninfo.conninfo_to_dict(url)
    # What the URL sets itself wins.
    kwargs: dict[str, Any] = {k: v for k, v in TCP_BOUNDS.items() if k not in given}
    kwargs["autocommit"] = True
    if pooler:
        kwargs["prepare_threshold"] = None
    else:
        # Added to the URL's own options (a search_path, say), which a keyword would replace.
        options = given.get("options") or ""
        if "idle_in_transaction_session_timeout" not in str(options):
            bound = f"-c idle_in_transaction_session_timeout={idle_ms(IDLE_IN_TRANSACTION)}"
            kwargs["options"] = f"{options} {bound}".strip()
    # A name the URL sets itself (a service's own label) wins over ours.
    if "application_name" not in url:
        kwargs["application_name"] = application_name()
    return kwargs


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def translate_errors(
    url: str, *, store: str = "the job store", setting: str = SETTING
) -> Iterator[None]:
    """psycopg errors become herd errors here, at the boundary, naming what failed."""
    try:
        yield
    except PoolTimeout as exc:
        raise BrokerUnavailable(
            f"PostgreSQL for {store} at {mask(url)} gave no connection in time ({exc});"
            f" is the server overloaded, or the pool too small (HERD_PG_POOL_SIZE)? check {setting}"
        ) from exc
    except psycopg.OperationalError as exc:
        first = mask(_first_line(exc))  # libpq quotes the piece of a URL it could not parse
        full = disk_full(exc, url)
        if full is not None:
            raise BrokerUnavailable(
                f"PostgreSQL for {store} at {mask(url)} failed because {full} ({first});"
                " free space on that disk, then run again"
            ) from exc
        raise BrokerUnavailable(
            f"PostgreSQL for {store} at {mask(url)} is unreachable ({first}); is the server"
            f" running? check {setting}"
        ) from exc
    except psycopg.Error as exc:
        raise BrokerError(f"PostgreSQL error in {store}: {mask(str(exc).strip())}") from exc


def migrations(package: str) -> list[tuple[int, str, str]]:
    """(version, name, sql) for every migration file (NNNN_name.sql) of ``package``."""
    out = []
    for entry in resources.files(package).iterdir():
        m = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if m:
            out.append((int(m[1]), m[2], entry.read_text(encoding="utf-8")))
    return sorted(out)


# Whether a store's open may create or update herd's tables (HERD_AUTO_MIGRATE): the
# stores of every feature migrate through migrate() below, so the policy is the
# process's, set by App.open from its settings; unset, the environment says.
_auto_migrate: bool | None = None


def set_auto_migrate(allowed: bool) -> None:
    global _auto_migrate
    _auto_migrate = allowed


def auto_migrate() -> bool:
    if _auto_migrate is not None:
        return _auto_migrate
    return auto_migrate_from(os.environ)


# Features whose tables need the vector extension (pgvector): `herd migrate --vectors`.
VECTOR_FEATURES = ("herd.rag.sql", "herd.semantic.sql")


# The databases herd made itself (the embedded server's): their tables being created is
# the expected first run, not the sign of a URL that names the wrong database.
_own_databases: set[tuple[str, str, str]] = set()


def _identity(host: Any, port: Any, dbname: Any) -> tuple[str, str, str]:
    return (str(host or ""), str(port or "5432"), str(dbname or ""))


def own_database(url: str) -> None:
    """Mark the database of ``url`` as herd's own: its first migration logs at INFO."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    _own_databases.add(_identity(info.get("host"), info.get("port"), info.get("dbname")))


def where(conn: AsyncConnection[Any]) -> str:
    """The database a connection is in, as a log line names it: no password."""
    info = conn.info
    return f"database {info.dbname!r} on {info.host}:{info.port} (user {info.user!r})"


async def migrate(
    conn: AsyncConnection[Any], package: str = "herd.queue.sql", *, explicit: bool = False
) -> list[int]:
    """Apply the migrations of ``package`` this database lacks; returns the versions applied.

    Each feature keeps its files in its own package, numbered in a range of its
    own (queue 0xxx, rag 1xxx, semantic 2xxx, eval 3xxx, cache 4xxx; the locks',
    cache's and eval's first files kept the 0003-0005 they were applied under),
    and migrates on its store's open, so the queue runs on servers without the
    extensions the others need. The lock is transaction-level: PgBouncer-safe.
    ``explicit``: asked for (`herd migrate`), so HERD_AUTO_MIGRATE=0 does not refuse.
    """
    allowed = explicit or auto_migrate()
    applied: list[int] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        cur = await conn.execute("SELECT to_regclass('herd_migrations') IS NOT NULL")
        row = await cur.fetchone()
        known = bool(row and row[0])
        done: set[int] = set()
        if known:
            cur = await conn.execute("SELECT version FROM herd_migrations")
            done = {row[0] for row in await cur.fetchall()}
        todo = [m for m in migrations(package) if m[0] not in done]
        if not todo:
            return []
        if not allowed:
            command = "herd migrate --vectors" if package in VECTOR_FEATURES else "herd migrate"
            raise MigrationError(
                f"herd's tables of {package} are missing or out of date in {where(conn)}"
                f" and HERD_AUTO_MIGRATE=0 forbids creating them here: run `{command}`"
            )
        if not known:
            # A URL that names the wrong database (one that accepted a wrong password,
            # a colleague's) must not be filled with tables without a word.
            info = conn.info
            own = _identity(info.host, info.port, info.dbname) in _own_databases
            log.log(
                logging.INFO if own else logging.WARNING,
                "creating herd's tables in %s, where herd had none",
                where(conn),
            )
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS herd_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
        for version, name, text in todo:
            try:
                await conn.execute(text.encode())
            except psycopg.Error as exc:
                raise MigrationError(f"migration {version:04d}_{name} failed: {exc}") from exc
            await conn.execute(
                "INSERT INTO herd_migrations (version, name) VALUES (%s, %s)", (version, name)
            )
            applied.append(version)
    return applied


# The features whose schema needs no extension (rag and semantic need pgvector and
# migrate on their first use): what `herd migrate` brings up to date.
PLAIN_FEATURES = (
    "herd.queue.sql",
    "herd.locks.sql",
    "herd.cache.sql",
    "herd.llm.sql",
    "herd.limits.sql",
)


async def migrate_all(
    url: str, packages: tuple[str, ...] = PLAIN_FEATURES, *, store: str = "the database"
) -> list[int]:
    """Migrate each of ``packages`` on one direct connection; the versions applied."""
    applied: list[int] = []
    with translate_errors(url, store=store):
        # pooler=True: safe on any server, and this connection is used once.
        kwargs = connect_kwargs(url, pooler=True)
        conn = await AsyncConnection.connect(url, **kwargs, connect_timeout=10)
        async with conn:
            for package in packages:
                applied += await migrate(conn, package, explicit=True)
    return applied


async def behind_pooler(conn: AsyncConnection[Any]) -> bool:
    """Whether ``conn`` goes through a pooler (PgBouncer, and the like).

    A pooler hands the client a backend key of its own (for its cancel requests),
    so the pid psycopg was told is not the server process that runs the queries.
    """
    cur = await conn.execute("SELECT pg_backend_pid()")
    row = await cur.fetchone()
    return row is None or row[0] != conn.info.backend_pid


# Inside unchecked_if_fresh(), a connection that came back from a statement less than
# FRESH seconds ago is handed out without the check's round trip: a worker checks a
# connection out for every claim and every batch of completions, and the checks were
# more round trips than the work itself (0.43 a job against 0.30 at 10 in flight).
FRESH = 1.0
_answered: weakref.WeakKeyDictionary[AsyncConnection[Any], float] = weakref.WeakKeyDictionary()
_unchecked: ContextVar[bool] = ContextVar("herd_unchecked_if_fresh", default=False)


@contextmanager
def unchecked_if_fresh() -> Iterator[None]:
    """Checkouts in this block skip the check on a connection that answered within
    ``FRESH`` seconds. Only for a statement that is safe to send again on another
    connection (it failed before running, or it is idempotent under its fencing), whose
    caller does so when it fails: a dropped connection then costs a second try, where
    outside such a block (a fenced transaction, a producer's enqueue) it would fail the
    caller's work."""
    token = _unchecked.set(True)
    try:
        yield
    finally:
        _unchecked.reset(token)


async def sent_again_if_dropped(attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt()`` on a connection that answered within ``FRESH`` seconds, unchecked;
    where it fails because that connection was gone (the server dropped it since), once
    more on a checked one. For a statement safe to send twice: a read, or a write
    fenced so that a second run changes nothing (a claim's, a completion's, a
    renewal's). A pool with no connection to give (PoolTimeout) is not tried again: a
    second try would wait as long."""
    with unchecked_if_fresh():
        try:
            return await attempt()
        except BrokerUnavailable as exc:
            if isinstance(exc.__cause__, PoolTimeout) or not isinstance(
                exc.__cause__, psycopg.OperationalError
            ):
                raise
    return await attempt()


async def _check_unless_fresh(conn: AsyncConnection[Any]) -> None:
    at = _answered.get(conn)
    if _unchecked.get() and at is not None and time.monotonic() - at < FRESH:
        return
    await AsyncConnectionPool.check_connection(conn)


def connection_pool(
    url: str, *, max_size: int, name: str = "herd", pooler: bool = False
) -> AsyncConnectionPool[Any]:
    """A pool of herd connections, opened later with ``open(wait=True)``.

    Each connection is checked on checkout (but see ``unchecked_if_fresh``): after a
    server restart, a failover or a dropped connection the pool would
    otherwise hand out a dead one, and a job's fenced write would fail although its
    lease is still held (a retry, and a model call paid again). The check costs one
    round trip per checkout.
    """
    return AsyncConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        open=False,
        kwargs=connect_kwargs(url, pooler=pooler),
        timeout=OPEN_TIMEOUT,
        name=name,
        check=_check_unless_fresh,
    )


class Listener:
    """One LISTEN connection shared by every channel of a pool's users.

    Callbacks get the payload; they run on the event loop and must not block.
    The connection is made on the first subscription and remade after a failure
    (with backoff); notifications missed meanwhile are found by the users' polls.
    """

    def __init__(self, url: str | None) -> None:
        self.url = url  # None: nowhere to listen (a pooler, no direct URL); waiters poll
        self._subs: dict[str, list[Callable[[str], None]]] = {}
        # Channels stay listened to once asked for: a waiter that comes and goes
        # (the broker's, every poll) must not cost a LISTEN each time.
        self._channels: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    def subscribe(self, channel: str, callback: Callable[[str], None]) -> None:
        self._subs.setdefault(channel, []).append(callback)
        if channel not in self._channels:
            self._channels.add(channel)
            if self._task is not None:
                # A new channel: reconnect, so one connection listens to them all.
                self._task.cancel()
                self._task = None
        if self.url is not None and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name="herd-listen")

    def unsubscribe(self, channel: str, callback: Callable[[str], None]) -> None:
        subs = self._subs.get(channel, [])
        if callback in subs:
            subs.remove(callback)

    async def _run(self) -> None:
        backoff = 0.1
        while self._channels and self.url is not None:
            try:
                conn = await AsyncConnection.connect(
                    self.url, **connect_kwargs(self.url), connect_timeout=10
                )
                async with conn:
                    for channel in sorted(self._channels):
                        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    self.connected.set()
                    backoff = 0.1
                    async for note in conn.notifies():
                        for callback in list(self._subs.get(note.channel, ())):
                            callback(note.payload)
            except psycopg.Error as exc:
                log.debug("LISTEN connection failed (%s); waiters poll", _first_line(exc))
            finally:
                self.connected.clear()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def close(self) -> None:
        self._subs.clear()
        self._channels.clear()
        if self._task is not None:
            from herd import aio

            await aio.stop(self._task)
            self._task = None


@dataclass
class _Shared:
    pool: AsyncConnectionPool[Any]
    listener: Listener
    users: int = 0
    sizes: list[int] = field(default_factory=list)


# Per event loop, because a pool's connections and tasks belong to the loop that
# made them (each test, each asyncio.run(), has its own).
_REGISTRY: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Shared]] = (
    weakref.WeakKeyDictionary()
)
_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
    weakref.WeakKeyDictionary()
)


def shared_pools() -> dict[str, AsyncConnectionPool[Any]]:
    """The pools of the running loop by URL (for /metrics and tests)."""
    found = _REGISTRY.get(asyncio.get_running_loop(), {})
    return {url: shared.pool for url, shared in found.items()}


class SharedPool:
    """One store's hold on its process's pool for ``url``.

    ``open()`` joins the pool (making and opening it when it is the first user,
    after a direct connection that fails fast with the server's own reason, where
    a pool would retry quietly until its timeout) and applies ``migrations``;
    ``close()`` leaves it, and the last user closes it. ``direct_url``: the server
    itself when ``url`` goes through PgBouncer; the pool's LISTEN goes there.
    ``adapt``: run on each connection this store checks out (client-side type
    adapters such as pgvector's; the pool's ``configure`` would impose them on
    every store, and server-side session state is what PgBouncer cannot keep).
    ``unchecked_if_fresh``: this store's checkouts skip the check on a connection that
    answered within FRESH seconds (see ``unchecked_if_fresh()``), for a store none of
    whose statements can cost a second payment when it fails: each fails its job's
    attempt before a model call, or is retried through an outage after one
    (herd.aio.through_outage). The checks were a third of an evaluation's statements.
    """

    def __init__(
        self,
        url: str,
        *,
        max_size: int,
        store: str,
        setting: str = SETTING,
        direct_url: str | None = None,
        adapt: Callable[[AsyncConnection[Any]], Awaitable[None]] | None = None,
        unchecked_if_fresh: bool = False,
    ) -> None:
        self.url = url
        self._adapt = adapt
        self._unchecked = unchecked_if_fresh
        self.max_size = max(1, max_size)
        self.store, self.setting = store, setting
        self.direct_url = direct_url
        self._shared: _Shared | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def errors(self) -> AbstractContextManager[None]:
        return translate_errors(self.url, store=self.store, setting=self.setting)

    @property
    def pool(self) -> AsyncConnectionPool[Any]:
        if self._shared is None:
            # What a closed pool raises: callers translate it as the server being gone.
            raise PoolClosed(f"{self.store} is not open")
        return self._shared.pool

    @property
    def listener(self) -> Listener:
        if self._shared is None:
            raise PoolClosed(f"{self.store} is not open")
        return self._shared.listener

    @property
    def session_url(self) -> str | None:
        """Where session state (LISTEN, a session-level lock) can live: the direct URL,
        else the pool's own URL when no pooler is in between, else nowhere (None)."""
        return self.listener.url

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection (autocommit), as ``AsyncConnectionPool.connection()``."""
        # Unchecked for the checkout only: a connection of another store taken inside
        # this block is checked as its own store says.
        token = _unchecked.set(True) if self._unchecked else None
        try:
            conn = await self.pool.getconn()
        finally:
            if token is not None:
                _unchecked.reset(token)
        try:
            if self._adapt is not None:
                await self._adapt(conn)
            try:
                yield conn
            except BaseException:
                _answered.pop(conn, None)
                raise
            _answered[conn] = time.monotonic()
        finally:
            await self.pool.putconn(conn)

    async def open(self, migrations: str | None = None) -> None:
        if self._shared is not None:
            return
        loop = asyncio.get_running_loop()
        lock = _LOCKS.setdefault(loop, asyncio.Lock())
        with self.errors():
            async with lock:
                pools = _REGISTRY.setdefault(loop, {})
                shared = pools.get(self.url)
                if shared is None:
                    conn = await AsyncConnection.connect(
                        self.url, **connect_kwargs(self.url, pooler=True), connect_timeout=10
                    )
                    async with conn:
                        pooler = await behind_pooler(conn)
                    pool = connection_pool(self.url, max_size=self.max_size, pooler=pooler)
                    try:
                        await pool.open(wait=True, timeout=OPEN_TIMEOUT)
                    except PoolTimeout as exc:
                        await pool.close()
                        raise psycopg.OperationalError(
                            "timed out opening the connection pool"
                        ) from exc
                    # Through a pooler LISTEN would hear nothing (its server connection
                    # goes back to the pool after the statement): the direct URL, or polls.
                    shared = _Shared(
                        pool, Listener(self.direct_url or (None if pooler else self.url))
                    )
                    pools[self.url] = shared
                elif self.direct_url and shared.listener.url != self.direct_url:
                    shared.listener.url = self.direct_url  # used from its next connection
                shared.users += 1
                shared.sizes.append(self.max_size)
                if self.max_size > shared.pool.max_size:
                    await shared.pool.resize(shared.pool.min_size, self.max_size)
                self._shared, self._loop = shared, loop
            if migrations is not None:
                try:
                    async with shared.pool.connection() as conn:
                        await migrate(conn, migrations)
                except BaseException:
                    await self.close()
                    raise

    async def close(self) -> None:
        shared, loop = self._shared, self._loop
        if shared is None or loop is None:
            return
        self._shared = self._loop = None
        shared.users -= 1
        shared.sizes.remove(self.max_size)
        if shared.users == 0:
            pools = _REGISTRY.get(loop, {})
            if pools.get(self.url) is shared:
                del pools[self.url]
            await shared.listener.close()
            await shared.pool.close()
        elif shared.sizes and max(shared.sizes) < shared.pool.max_size:
            await shared.pool.resize(shared.pool.min_size, max(shared.sizes))

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        with self.errors():
            async with self.pool.connection() as conn, conn.transaction():
                yield conn


class SessionLockHeld(BrokerError):
    """Another session holds the lock: the name is in use by another live process."""


class SessionLock:
    """A session-level advisory lock on ``name``, held on a connection of its own.

    The server drops a session's locks with the session, so the lock says whether
    the process that took it still has its connection: a killed process loses it at
    once (the kernel closes the socket), a frozen one keeps it (the socket stays
    open). Others see it in pg_locks under :attr:`key` (``hashtextextended(name, 0)``,
    computed by the server so every reader agrees). ``held`` is set while the lock
    is ours; after the connection fails the lock is taken again in the background
    (until then ``held`` is clear). Needs a session: a direct URL, never a pooler.
    """

    def __init__(self, url: str, name: str, *, store: str = "the job store") -> None:
        self.url, self.name, self.store = url, name, store
        self.key: int | None = None
        self.held = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def acquire(self) -> None:
        """Take the lock (SessionLockHeld if another session has it) and keep it."""
        with translate_errors(self.url, store=self.store):
            conn = await self._lock()
        self._task = asyncio.create_task(self._keep(conn), name="herd-session-lock")

    async def _lock(self) -> AsyncConnection[Any]:
        conn = await AsyncConnection.connect(
            self.url, **connect_kwargs(self.url, pooler=True), connect_timeout=10
        )
        try:
            cur = await conn.execute(
                "SELECT k, pg_try_advisory_lock(k) FROM hashtextextended(%s, 0) AS k",
                (self.name,),
            )
            row = await cur.fetchone()
        except BaseException:
            await conn.close()
            raise
        if row is None or not row[1]:
            await conn.close()
            raise SessionLockHeld(
                f"{self.name!r} is held by another live session of {mask(self.url)}:"
                " worker ids must be unique per process"
            )
        self.key = int(row[0])
        self.held.set()
        return conn

    async def _keep(self, conn: AsyncConnection[Any]) -> None:
        while True:
            try:
                async with conn:
                    try:
                        # Nothing is LISTENed to: this only returns, raising, when the
                        # connection breaks, which it notices without any polling.
                        async for _ in conn.notifies():
                            pass
                    except asyncio.CancelledError:
                        # Released: the lock goes now, not once the server has ended
                        # the closed session (a new holder could be refused until then).
                        with contextlib.suppress(psycopg.Error):
                            await conn.execute("SELECT pg_advisory_unlock_all()")
                        raise
            except psycopg.Error as exc:
                log.warning(
                    "the connection holding %r broke (%s); taking it again",
                    self.name,
                    _first_line(exc),
                )
            finally:
                self.held.clear()
            backoff = 0.0  # at once: claimers may look for the lock meanwhile
            while True:
                await asyncio.sleep(backoff)
                try:
                    conn = await self._lock()
                    break
                except (psycopg.Error, SessionLockHeld) as exc:
                    # Held: our old session may linger until the server notices it is
                    # gone; it keeps the mark meanwhile.
                    log.debug("retaking %r failed: %s", self.name, exc)
                    backoff = min(max(0.1, backoff * 2), 5.0)

    async def wait_held(self, timeout: float = 10.0) -> bool:
        """Whether the mark stands, waiting up to ``timeout`` while it is being remade."""
        try:
            await asyncio.wait_for(self.held.wait(), timeout)
        except TimeoutError:
            pass
        return self.held.is_set()

    async def release(self) -> None:
        """Let go: closing the session drops the lock."""
        self.held.clear()
        if self._task is not None:
            from herd import aio

            await aio.stop(self._task)
            self._task = None
