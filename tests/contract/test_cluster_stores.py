"""Every Redis store on a real Redis Cluster of 3 masters, from a plain URL of one node.

The contract suite runs on the cluster too (the "redis-cluster" backend); these
tests make sure the work spreads over every master: queues, lock names and cache
namespaces chosen so that each node serves some of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from herd.cache import RedisCacheStore
from herd.locks import RedisLocks
from herd.locks.redis import lock_key
from herd.queue.base import Completion, JobStatus
from herd.queue.redis import RedisBroker, prefix
from tests.helpers import eventually, job


def _spread(cluster: Any, key_of: Any, count: int = 3) -> list[str]:
    """Names, ``count`` of them, whose keys ``key_of(name)`` lie on different masters."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < min(count, cluster.masters):
        name = f"n{uuid.uuid4().hex[:6]}{i}"
        found.setdefault(cluster.master_of(key_of(name)).port, name)
        i += 1
    return list(found.values())


@pytest.fixture
def cluster(redis_cluster_server: Any) -> Any:
    redis_cluster_server.flush()
    return redis_cluster_server


async def test_the_broker_serves_queues_on_every_master_from_any_nodes_url(cluster: Any) -> None:
    queues = _spread(cluster, lambda q: prefix(q) + "meta")
    # The URL of the last node, not of the first: any node will do.
    broker = RedisBroker(cluster.nodes[-1].url)
    await broker.open()
    try:
        assert broker.cluster and isinstance(broker._redis, RedisCluster)
        made = await broker.enqueue([job(queue=q) for q in queues for _ in (1, 2)])
        assert all(r.created for r in made) and len({r.job_id for r in made}) == 6
        # One claim over the three queues, each on its own master.
        leases = await broker.claim(queues, "w1", 10)
        assert sorted(lease.job_id for lease in leases) == sorted(r.job_id for r in made)
        assert (
            await broker.complete_if_leased([Completion(ls, {"ok": 1}) for ls in leases])
            == [True] * 6
        )
        # Every job is found from its id alone, on whichever node it lives.
        jobs = await broker.get_jobs([r.job_id for r in made])
        assert {j.queue for j in jobs} == set(queues)
        assert {j.status for j in jobs} == {JobStatus.SUCCEEDED}
        assert (await broker.get_job(made[-1].job_id)).queue == queues[-1]  # type: ignore[union-attr]
        counts = {s.queue: s.counts for s in await broker.stats()}
        assert counts == {q: {JobStatus.SUCCEEDED: 2} for q in queues}
        # A fenced write with a stale token is refused on the cluster as on one server.
        assert await broker.complete_if_leased([Completion(leases[0], {"again": 1})]) == [True]
        (fresh,) = await broker.enqueue([job(queue=queues[0])])
        (lease,) = await broker.claim([queues[0]], "w1", 1)
        stale = dataclasses.replace(lease, token=lease.token - 1)
        assert await broker.complete_if_leased([Completion(stale, {})]) == [False]
        assert fresh.job_id == lease.job_id
    finally:
        await broker.close()


async def test_a_waiting_worker_wakes_for_a_job_on_any_master(cluster: Any) -> None:
    queues = _spread(cluster, lambda q: prefix(q) + "meta")
    broker = RedisBroker(cluster.url)
    await broker.open()
    try:
        await broker.enqueue([job(queue=q) for q in queues])  # streams exist on every master
        await broker.claim(queues, "w1", 10)
        waiting = asyncio.create_task(broker.wait_for_jobs(queues, timeout=30))
        await asyncio.sleep(0.2)  # let the XREADs block (the wake-up is the event here)
        await broker.enqueue([job(queue=queues[-1])])
        await asyncio.wait_for(waiting, 10)  # well before the 30 s timeout
    finally:
        await broker.close()


async def test_locks_on_every_master(cluster: Any) -> None:
    names = _spread(cluster, lock_key)
    one, two = RedisLocks(cluster.url), RedisLocks(cluster.nodes[1].url)
    await one.open()
    await two.open()
    try:
        for name in names:
            lease = await one.acquire(name, ttl=30)
            assert lease is not None
            assert await two.acquire(name, ttl=30) is None
            # A waiter wakes on the release (the notice crosses nodes: cluster pub/sub).
            waiter = asyncio.create_task(two.acquire(name, ttl=30, wait=20))
            await asyncio.sleep(0.1)
            assert await one.release(lease)
            taken = await asyncio.wait_for(waiter, 10)
            assert taken is not None and taken.token > lease.token
            assert await two.check(taken) and not await one.check(lease)
    finally:
        await one.close()
        await two.close()


async def test_the_cache_on_every_master(cluster: Any) -> None:
    namespaces = _spread(cluster, lambda ns: f"herd:cache:{{{ns}}}:stats")
    store = RedisCacheStore(cluster.url)
    await store.open()
    try:
        for ns in namespaces:
            await store.put(ns, "a", {"v": ns}, delta=0.1, ttl=60)
            await store.put(ns, "b", [1], delta=0.1, ttl=None)
            await store.count({"hits": 2}, ns)
        for ns in namespaces:
            entry = await store.get(ns, "a")
            assert entry is not None and entry.value == {"v": ns}
        stats = await store.stats()
        assert {ns: (s["entries"], s["hits"]) for ns, s in stats.items()} == {
            ns: (2, 2) for ns in namespaces
        }
        # A clear finds its keys on their master (SCAN over every node).
        assert await store.clear(namespaces[0]) == 2
        assert await store.get(namespaces[0], "a") is None
        assert await store.get(namespaces[1], "a") is not None
    finally:
        await store.close()


def test_the_spread_names_really_lie_on_several_masters(cluster: Any) -> None:
    names = _spread(cluster, lambda q: prefix(q) + "meta")
    assert len({cluster.master_of(prefix(q) + "meta").port for q in names}) == 3
    assert len({key_slot((prefix(q) + "meta").encode()) for q in names}) == 3


async def test_a_dead_workers_jobs_on_every_master_are_taken_over_at_once(cluster: Any) -> None:
    queues = _spread(cluster, lambda q: prefix(q) + "meta")
    gone, rescuer = RedisBroker(cluster.url), RedisBroker(cluster.nodes[1].url)
    await gone.open()
    await rescuer.open()
    try:
        # One mark on every master: each queue's jobs record the mark of their own node.
        assert await gone.hold_liveness("w-gone") is True
        await gone.enqueue([job(queue=q, lease_seconds=60) for q in queues])
        held = await gone.claim(queues, "w-gone", 10)
        assert len(held) == 3
        # Its connections close as a killed process's would (the 60 s leases stand).
        await gone.release_liveness("w-gone")
        taken: list[Any] = []

        async def rescued() -> bool:
            taken.extend(await rescuer.claim(queues, "w-rescuer", 10))
            return len(taken) == 3

        await eventually(rescued, timeout=10, interval=0.05)
        assert {ls.job_id for ls in taken} == {ls.job_id for ls in held}
        assert all(ls.stalls == 1 for ls in taken)
        for lease in taken:
            j = await rescuer.get_job(lease.job_id)
            assert j is not None and j.last_error == "worker w-gone died holding the lease"
    finally:
        await gone.close()
        await rescuer.close()
