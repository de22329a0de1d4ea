"""Redis for every herd store: one client per (event loop, URL, decoding), errors.

The broker, the exact cache, the locks and the semantic cache of a process that
name the same URL share one bounded ``BlockingConnectionPool`` (two, where a
store needs raw bytes: the semantic cache's vectors), reference-counted like
:mod:`herd.db.postgres`: a burst waits for a connection instead of opening more,
so a process holds at most the largest size asked per pool. Each connection is
named ``herd:<pid>`` (``CLIENT LIST`` shows whose it is).

A plain ``redis://`` URL of any node of a Redis Cluster is enough: ``open()`` asks
the server (``INFO cluster``) and, where ``cluster_enabled:1``, the stores of the
URL share one ``redis.asyncio.cluster.RedisCluster`` instead (it finds the other
nodes with ``CLUSTER SLOTS`` and routes each command by its key's slot). Stores
reach the client through :attr:`SharedClient.client` at call time, and run their
scripts through :meth:`SharedClient.register_script`, so that the swap reaches them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio as aioredis
from redis import exceptions as rexc
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from herd.errors import BrokerError, BrokerUnavailable, ConfigError
from herd.masking import mask

log = logging.getLogger("herd.db")

SETTING = "HERD_REDIS_URL"
WAIT = 30.0  # seconds a command waits for a free connection of a full pool


def client_name() -> str:
    return f"herd:{os.getpid()}"


@contextmanager
def translate_errors(
    url: str, *, store: str = "the job store", setting: str = SETTING
) -> Iterator[None]:
    """redis-py errors become herd errors here, at the boundary, naming what failed."""
    try:
        yield
    except (rexc.ConnectionError, rexc.TimeoutError, OSError) as exc:
        raise BrokerUnavailable(
            f"Redis for {store} at {mask(url)} is unreachable ({mask(str(exc))}); is the server"
            f" running? check {setting}"
        ) from exc
    except rexc.RedisError as exc:
        raise BrokerError(f"Redis error in {store}: {mask(str(exc))}") from exc
    except rexc.RedisClusterException as exc:
        # Not a RedisError: a cluster client whose topology refresh reached no node (a
        # restart, dropped connections) raises one, so it must read as an outage too.
        if not _cluster_unreachable(exc):
            raise BrokerError(f"Redis Cluster error in {store}: {mask(str(exc))}") from exc
        raise BrokerUnavailable(
            f"Redis Cluster for {store} at {mask(url)} is unreachable ({mask(str(exc))});"
            f" is the cluster running? check {setting}"
        ) from exc


def _cluster_unreachable(exc: Exception) -> bool:
    """A cluster error that means no node answered: its own class where redis-py has one
    (RedisClusterUnreachableError, 8.2), a slot nobody serves, or a connection failure
    under it (redis-py 5 to 8.1 raise the base class from it)."""
    if type(exc).__name__ == "RedisClusterUnreachableError":
        return True
    if isinstance(exc, rexc.SlotNotCoveredError):
        return True
    return isinstance(exc.__cause__, (rexc.ConnectionError, rexc.TimeoutError, OSError))


def _pool(url: str, *, decode: bool, size: int) -> aioredis.BlockingConnectionPool:
    try:
        return aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=size,
            timeout=WAIT,
            decode_responses=decode,
            protocol=2,
            health_check_interval=30,
            client_name=client_name(),
        )
    except ValueError as exc:  # e.g. an unencoded '/' in the password: not a traceback
        raise ConfigError(mask(f"the Redis URL {url} cannot be read: {exc}")) from None


@dataclass
class _Shared:
    pool: aioredis.ConnectionPool
    users: int = 0
    sizes: list[int] = field(default_factory=list)
    # The process's cluster client for the URL, where the server is a cluster node.
    cluster: RedisCluster | None = None


async def is_cluster(client: aioredis.Redis) -> bool:
    """Whether the server of ``client`` is a Redis Cluster node (``cluster_enabled:1``)."""
    try:
        info = await client.info("cluster")
    except rexc.ResponseError:
        return False  # INFO sections renamed or refused (a proxy): treat as one server
    return str(info.get("cluster_enabled", "0")) == "1"


def _cluster(url: str, *, decode: bool, size: int) -> RedisCluster:
    try:
        return RedisCluster.from_url(
            url,
            # Per node; a burst past it fails (redis-py's cluster nodes do not wait).
            max_connections=max(size, 64),
            decode_responses=decode,
            protocol=2,
            health_check_interval=30,
            client_name=client_name(),
        )
    except ValueError as exc:
        raise ConfigError(mask(f"the Redis URL {url} cannot be read: {exc}")) from None


class Script:
    """A Lua script of a store, run on whatever client the store's
    :class:`SharedClient` holds now (a plain or a cluster one)."""

    def __init__(self, owner: SharedClient, text: str) -> None:
        self._owner = owner
        self._script = owner.client.register_script(text)

    async def __call__(
        self, keys: Sequence[Any] = (), args: Sequence[Any] = (), client: Any = None
    ) -> Any:
        target = client if client is not None else self._owner.client
        return await self._script(keys=list(keys), args=list(args), client=target)


_REGISTRY: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, bool], _Shared]] = (
    weakref.WeakKeyDictionary()
)


def shared_pools() -> dict[tuple[str, bool], aioredis.ConnectionPool]:
    """The running loop's pools by (URL, decoded)."""
    found = _REGISTRY.get(asyncio.get_running_loop(), {})
    return {key: shared.pool for key, shared in found.items()}


class SharedClient:
    """One store's hold on its process's Redis client for ``url``.

    The client itself exists from the constructor on (stores register their
    scripts on it), bound to no connection until used; ``open()`` joins the
    process's pool for the URL (the running loop's) and pings; ``close()``
    leaves, and the last user disconnects it.
    """

    def __init__(
        self,
        url: str,
        *,
        store: str,
        decode: bool = True,
        max_size: int = 32,
        setting: str = SETTING,
    ) -> None:
        self.url, self.store, self.setting = url, store, setting
        self.decode, self.max_size = decode, max(1, max_size)
        # A client of its own until open() swaps in the shared pool: scripts
        # registered on it keep working (they call through this object). An
        # unreadable URL fails here, in the constructor, as it always did.
        self._plain: aioredis.Redis = aioredis.Redis(connection_pool=self._placeholder())
        self.client: Any = self._plain  # the RedisCluster after open() on a cluster
        self._shared: _Shared | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def cluster(self) -> bool:
        """Whether the server is a Redis Cluster (known once open)."""
        return isinstance(self.client, RedisCluster)

    def register_script(self, text: str) -> Script:
        return Script(self, text)

    def _placeholder(self) -> aioredis.BlockingConnectionPool:
        return _pool(self.url, decode=self.decode, size=self.max_size)

    def errors(self) -> Any:
        return translate_errors(self.url, store=self.store, setting=self.setting)

    async def open(self) -> None:
        if self._shared is None:
            loop = asyncio.get_running_loop()
            clients = _REGISTRY.setdefault(loop, {})
            key = (self.url, self.decode)
            shared = clients.get(key)
            if shared is None:
                shared = clients[key] = _Shared(self._plain.connection_pool)
                try:
                    with self.errors():
                        if await is_cluster(self._plain):
                            shared.cluster = _cluster(
                                self.url, decode=self.decode, size=self.max_size
                            )
                except BaseException:
                    del clients[key]
                    await self._plain.connection_pool.disconnect()
                    raise
            else:
                await self._plain.connection_pool.disconnect()
            shared.users += 1
            shared.sizes.append(self.max_size)
            shared.pool.max_connections = max(shared.pool.max_connections, self.max_size)
            # Share the pool, keep our own client object (its registered scripts).
            self._plain.connection_pool = shared.pool
            self.client = shared.cluster or self._plain
            self._shared, self._loop = shared, loop
        with self.errors():
            await self.client.ping()

    async def close(self) -> None:
        shared, loop = self._shared, self._loop
        if shared is None or loop is None:
            await self._plain.connection_pool.disconnect()
            return
        self._shared = self._loop = None
        shared.users -= 1
        shared.sizes.remove(self.max_size)
        pool = shared.pool
        if shared.users == 0:
            clients = _REGISTRY.get(loop, {})
            if clients.get((self.url, self.decode)) is shared:
                del clients[(self.url, self.decode)]
            await pool.disconnect()
            if shared.cluster is not None:
                await shared.cluster.aclose()
        else:
            pool.max_connections = max(shared.sizes)
        # A reopen starts on a pool of its own again.
        self._plain.connection_pool = self._placeholder()
        self.client = self._plain


def node_url(url: str, host: str, port: int | str) -> str:
    """``url`` (its credentials, database, options) for the cluster node ``host:port``."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{auth}@{host}:{port}" if auth else f"{host}:{port}"))


def mark_name(owner: str) -> str:
    """The client name of ``owner``'s liveness connection (names allow '!'..'~' only)."""
    return "herd-live:" + "".join(c if "!" <= c <= "~" else "_" for c in owner)


class HeldConnection:
    """A connection of its own, named :func:`mark_name` (owner), kept open by a blocking
    read that never returns: a liveness mark others see with ``CLIENT LIST ID``.

    The server drops the connection when the process dies (the kernel closes the
    socket); a frozen process keeps it (its socket stays open, and a blocked client
    is exempt from the server's idle ``timeout``). :attr:`id` is the connection's
    ``CLIENT ID`` with the server's run (``<id>@<run_id>``); ``held`` is set while
    it is open. After a failure a new one is made in the background (a new id;
    ``held`` clear meanwhile).
    """

    def __init__(
        self, url: str, owner: str, *, store: str = "the job store", key: str | None = None
    ) -> None:
        """``key``: the key the read blocks on (default ``herd:live:<name>``); on a
        cluster node, one of a slot that node serves, or the read is refused (MOVED)."""
        self.url, self.owner, self.store = url, owner, store
        self.name = mark_name(owner)
        self.key = key or f"herd:live:{self.name}"
        self.id = ""
        self.held = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def acquire(self) -> None:
        with translate_errors(self.url, store=self.store):
            client = await self._connect()
        self._task = asyncio.create_task(self._keep(client), name="herd-held-connection")

    async def _connect(self) -> aioredis.Redis:
        try:
            client = aioredis.Redis.from_url(
                self.url,
                single_connection_client=True,
                decode_responses=True,
                protocol=2,
                client_name=self.name,
                # The read is meant to block for the process's life: redis-py 8 reads with
                # a 5 s socket timeout by default, which broke the mark every 5 s, and a
                # claim meanwhile took a live worker's jobs over as a dead one's.
                socket_timeout=None,
                socket_connect_timeout=5.0,
                # redis-py would reconnect under the blocked read by itself, and the
                # mark would go on under an id the server no longer knows.
                retry=Retry(NoBackoff(), 0),
            )
        except ValueError as exc:
            raise ConfigError(mask(f"the Redis URL {self.url} cannot be read: {exc}")) from None
        try:
            # The id with the server's run: ids start again from 1 after a restart.
            run = (await client.info("server")).get("run_id", "")
            self.id = f"{await client.client_id()}@{run}"
        except BaseException:
            await client.aclose()
            raise
        self.held.set()
        return client

    async def _keep(self, client: aioredis.Redis) -> None:
        while True:
            try:
                # A key nobody pushes to: the read blocks until the connection breaks.
                await client.blpop([self.key], timeout=0)
            except (rexc.RedisError, OSError) as exc:
                log.warning("the liveness connection of %s broke (%s)", self.owner, exc)
            finally:
                self.held.clear()
                await client.aclose()
            backoff = 0.0  # at once: claimers may look for the mark meanwhile
            while True:
                await asyncio.sleep(backoff)
                try:
                    client = await self._connect()
                    break
                except (rexc.RedisError, OSError) as exc:
                    log.debug("reconnecting the liveness connection failed: %s", exc)
                    backoff = min(max(0.1, backoff * 2), 5.0)

    async def wait_held(self, timeout: float = 10.0) -> bool:
        """Whether the mark stands, waiting up to ``timeout`` while it is being remade."""
        try:
            await asyncio.wait_for(self.held.wait(), timeout)
        except TimeoutError:
            pass
        return self.held.is_set()

    async def release(self) -> None:
        self.held.clear()
        if self._task is not None:
            from herd import aio

            await aio.stop(self._task)
            self._task = None
