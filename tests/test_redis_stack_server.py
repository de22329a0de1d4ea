"""Smoke tests for the Redis Stack test server (herd/testing/servers/redis_stack.py)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.commands.search.query import Query

from herd.testing.servers.redis_stack import RedisStackServer

CACHE_DIR = Path(__file__).parent.parent / ".herd-test" / "cache"

ServerFactory = Callable[..., RedisStackServer]


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[ServerFactory]:
    """Factory: started RedisStackServer instances, all stopped at teardown."""
    servers: list[RedisStackServer] = []

    def factory(name: str = "redis", **kwargs: Any) -> RedisStackServer:
        server = RedisStackServer(CACHE_DIR, tmp_path / name, **kwargs)
        servers.append(server)
        server.start()
        return server

    yield factory
    errors: list[Exception] = []
    for server in servers:
        try:
            server.stop()
        except Exception as exc:  # still kill the rest
            server.kill()
            errors.append(exc)
    if errors:
        raise errors[0]


def _client(server: RedisStackServer) -> redis.Redis:
    return redis.Redis.from_url(server.url, socket_timeout=5)


def _vec(*xs: float) -> bytes:
    return struct.pack(f"<{len(xs)}f", *xs)


def test_ping_and_modules(make_server: ServerFactory) -> None:
    server = make_server()
    assert server.pid is not None
    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    with _client(server) as r:
        assert r.ping() is True
        assert {b"search", b"ReJSON"} <= {m[b"name"] for m in r.module_list()}
        assert r.config_get("save")["save"] == ""
        assert r.config_get("appendonly")["appendonly"] == "no"
        assert r.config_get("bind")["bind"] == "127.0.0.1"


def test_vector_knn(make_server: ServerFactory) -> None:
    server = make_server()
    with _client(server) as r:
        create = (
            "FT.CREATE idx ON HASH PREFIX 1 doc: "
            "SCHEMA v VECTOR HNSW 6 TYPE FLOAT32 DIM 4 DISTANCE_METRIC COSINE"
        )
        assert r.execute_command(*create.split()) in (b"OK", "OK", True)
        r.hset("doc:1", mapping={"v": _vec(1.0, 0.0, 0.0, 0.0)})
        r.hset("doc:2", mapping={"v": _vec(0.0, 1.0, 0.0, 0.0)})
        r.hset("doc:3", mapping={"v": _vec(0.5, 0.5, 0.0, 0.0)})

        query = (
            Query("*=>[KNN 2 @v $vec AS score]").sort_by("score").return_fields("score").dialect(2)
        )
        res = r.ft("idx").search(query, query_params={"vec": _vec(1.0, 0.1, 0.0, 0.0)})
        ids = [doc.id for doc in res.docs]
        scores = [float(doc.score) for doc in res.docs]
        assert ids == ["doc:1", "doc:3"]
        assert scores[0] < scores[1]


def test_aof_survives_graceful_restart(make_server: ServerFactory) -> None:
    server = make_server(appendonly=True)
    port, old_pid = server.port, server.pid
    with _client(server) as r:
        assert r.config_get("appendonly")["appendonly"] == "yes"
        r.set("herd:key", "value-1")
    server.restart()
    assert server.port == port
    assert server.pid is not None and server.pid != old_pid
    with _client(server) as r:
        assert r.get("herd:key") == b"value-1"


def test_aof_survives_sigkill(make_server: ServerFactory) -> None:
    # appendfsync=always: every write is on disk before the reply, so SIGKILL loses nothing.
    server = make_server(appendonly=True, appendfsync="always")
    port = server.port
    with _client(server) as r:
        r.set("herd:crash", "survivor")
        r.rpush("herd:list", "a", "b", "c")
    server.kill()
    assert server.pid is None
    with pytest.raises(redis.ConnectionError), _client(server) as r:
        r.ping()
    server.start()
    assert server.port == port
    with _client(server) as r:
        assert r.get("herd:crash") == b"survivor"
        assert r.lrange("herd:list", 0, -1) == [b"a", b"b", b"c"]


def test_stop_is_idempotent_and_start_failure_is_clear(tmp_path: Path) -> None:
    server = RedisStackServer(CACHE_DIR, tmp_path / "bad", extra_args=["--no-such-option", "1"])
    with pytest.raises(RuntimeError, match="no-such-option"):
        server.start(timeout=10)
    assert server.pid is None
    server.stop()
    server.stop()
