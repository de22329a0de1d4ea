"""A store that cannot reach its server says which store, where, and which setting."""

from __future__ import annotations

import pytest

from herd.cache import PostgresCacheStore, RedisCacheStore
from herd.errors import BrokerUnavailable
from herd.llm.eval import EvalStore
from herd.locks import PostgresLocks, RedisLocks
from herd.queue.postgres import PostgresBroker
from herd.queue.redis import RedisBroker
from herd.rag.store import RagStore
from herd.semantic.postgres import PostgresSemanticStore
from herd.semantic.redis import RedisSemanticStore
from herd.testing.servers.redis_cluster import RedisCluster
from tests.conftest import CACHE

PG = "postgresql://herd:s3cret@127.0.0.1:1/herd?connect_timeout=2"
REDIS = "redis://:s3cret@127.0.0.1:1/0"


def _open(store):
    return (
        store.open(None)
        if isinstance(store, PostgresSemanticStore | RedisSemanticStore)
        else (store.open())
    )


@pytest.mark.parametrize(
    ("make", "store"),
    [
        (lambda: PostgresBroker(PG), "the job store"),
        (lambda: PostgresLocks(PG), "the lock store"),
        (lambda: PostgresCacheStore(PG), "the cache"),
        (lambda: EvalStore(PG), "the evaluation store"),
        (lambda: PostgresSemanticStore(PG), "the semantic cache"),
        (lambda: RagStore(PG), "the corpus index"),
    ],
)
async def test_postgres_errors_name_the_store_and_the_setting(make, store):
    with pytest.raises(BrokerUnavailable) as caught:
        await _open(make())
    text = str(caught.value)
    assert f"PostgreSQL for {store} at " in text
    assert "check HERD_DATABASE_URL" in text
    assert "s3cret" not in text and "127.0.0.1:1" in text


@pytest.mark.parametrize(
    ("make", "store"),
    [
        (lambda: RedisBroker(REDIS), "the job store"),
        (lambda: RedisLocks(REDIS), "the lock store"),
        (lambda: RedisCacheStore(REDIS), "the cache"),
        (lambda: RedisSemanticStore(REDIS), "the semantic cache"),
    ],
)
async def test_redis_errors_name_the_store_and_the_setting(make, store):
    made = make()
    try:
        with pytest.raises(BrokerUnavailable) as caught:
            await _open(made)
    finally:
        await made.close()
    text = str(caught.value)
    assert f"Redis for {store} at " in text
    assert "check HERD_REDIS_URL" in text
    assert "s3cret" not in text and "127.0.0.1:1" in text


async def test_a_redis_cluster_that_went_away_reads_as_an_outage(tmp_path):
    """Every node of a cluster gone under an open broker: redis-py's cluster client raises
    its own exception (not a RedisError) once a topology refresh reaches no node; herd
    reports the outage as BrokerUnavailable, which callers wait out, not a raw error."""
    cluster = RedisCluster(CACHE / "cache", tmp_path / "cluster", masters=3)
    cluster.start()
    try:
        broker = RedisBroker(cluster.url)
        await broker.open()
        try:
            assert await broker.list_jobs() == []
            for node in cluster.nodes:
                node.kill()
            with pytest.raises(BrokerUnavailable, match="unreachable"):
                await broker.list_jobs()
        finally:
            await broker.close()
    finally:
        cluster.stop()
