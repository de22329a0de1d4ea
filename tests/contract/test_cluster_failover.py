"""What a failover of a Redis Cluster master loses, and what holds (docs/cluster.md).

Redis replicates asynchronously: a master acknowledges a claim before its replica
has it. Here the replica's link is cut (and kept cut), a claim lands on the
master alone, and the master is killed: the replica that takes over never saw the
claim. The claim is lost (the job is pending again and runs a second time), but
the fence holds: tokens have a floor from the server's clock, so the next claim's
token exceeds the lost one and the first holder's writes are refused.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from herd.queue.base import Completion, JobStatus
from herd.queue.redis import RedisBroker, prefix
from herd.testing.servers.redis_cluster import RedisCluster
from tests.conftest import CACHE
from tests.helpers import eventually, job

QUEUE = "failover"


@pytest.fixture
def replicated(tmp_path: Any) -> Any:
    cluster = RedisCluster(CACHE / "cache", tmp_path / "cluster", masters=3, replicas=1)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _replica_of(cluster: Any, master: Any) -> Any:
    for node in cluster.nodes:
        if node is master or node.pid is None:
            continue
        with cluster.client(node) as c:
            info = c.info("replication")
        if info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port:
            return node
    raise AssertionError(f"no replica follows {master.port}")


async def test_a_lost_claim_runs_again_and_its_token_is_never_given_again(replicated: Any) -> None:
    meta = prefix(QUEUE) + "meta"
    master = replicated.master_of(meta)
    replica = _replica_of(replicated, master)
    broker = RedisBroker(replica.url)  # a URL of a node that survives the failover
    await broker.open()
    try:
        (made,) = await broker.enqueue([job(queue=QUEUE, lease_seconds=60)])
        key = f"{prefix(QUEUE)}job:{made.job_id}"
        with replicated.client(replica) as r:
            r.execute_command("READONLY")
            await eventually(lambda: _async(r.exists(key)))  # the replica has the job
            # Cut its link and keep it cut: a password the master does not ask for
            # fails its AUTH on every reconnect (else a partial resync would bring
            # the claim over from the master's backlog).
            r.config_set("masterauth", "not-asked-for")
            r.client_kill_filter(_type="master")
        (first,) = await broker.claim([QUEUE], "w1", 1)
        master.kill()  # before the replica is back: the claim lives on no other node
        deadline = time.monotonic() + 30
        while True:
            with replicated.client(replica) as r:
                if r.info("replication").get("role") == "master":
                    break
            assert time.monotonic() < deadline, "the replica was not promoted"
            time.sleep(0.05)

        async def pending_again() -> Any:
            try:
                j = await broker.get_job(made.job_id)
            except Exception:  # the client is still learning the new slot map
                return None
            return j

        after = await eventually(pending_again, timeout=20)
        # The claim is gone: the job is pending under the token it had before it.
        assert after.status == JobStatus.PENDING and after.lease_token < first.token
        (second,) = await broker.claim([QUEUE], "w2", 1)
        # Past the lost token all the same: the first holder's writes are refused.
        assert second.token > first.token
        assert await broker.complete_if_leased([Completion(first, {"by": "w1"})]) == [False]
        assert await broker.renew_if_leased([first]) == {}
        assert await broker.complete_if_leased([Completion(second, {"by": "w2"})]) == [True]
        done = await broker.get_job(made.job_id)
        assert done is not None and done.result == {"by": "w2"}
    finally:
        await broker.close()


async def _async(value: Any) -> Any:
    return value
