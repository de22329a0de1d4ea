"""Liveness marks of workers on Redis: a connection of its own per worker, named after
it and blocked on a read, whose CLIENT ID claims record for the worker's jobs
(herd:{q}:owners). A claim that finds that id gone from CLIENT LIST takes the jobs
over at once, long before their leases end. On a cluster a worker holds one mark on
every master: a queue's mark and its CLIENT LIST are on the node serving its slot.
Used by herd.queue.redis.RedisBroker, which owns the client and the key layout."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from redis import exceptions as rexc
from redis.crc import key_slot

from herd.config import mask_url
from herd.db import redis as rdb
from herd.errors import BrokerError

log = logging.getLogger("herd.redis")

# Seconds between one process's looks (CLIENT LIST ID) for workers whose liveness
# connection is gone: a killed worker's jobs run again within about this plus the
# claimers' poll interval.
ORPHAN_CHECK = 0.5


class Liveness:
    """The marks of this process's workers, and the look for other workers' lost ones."""

    def __init__(
        self,
        url: str,
        client: rdb.SharedClient,
        errors: Callable[[], AbstractContextManager[None]],
        prefix: Callable[[str], str],
    ) -> None:
        self.url = url
        self._client = client
        self._errors = errors
        self._prefix = prefix
        # owner -> server ("" for a single one, host:port of each master) -> its mark
        self._marks: dict[str, dict[str, rdb.HeldConnection]] = {}
        self._next_orphan_check = 0.0
        self._client_list_refused = False

    @property
    def _redis(self) -> Any:
        return self._client.client

    async def release_all(self) -> None:
        for owner in list(self._marks):
            await self.release(owner)

    async def hold(self, owner: str) -> bool:
        """A connection of its own, named after ``owner`` and blocked on a read, whose
        CLIENT ID claims record for the owner's jobs (herd:{q}:owners): another
        worker's claim that finds that id gone from CLIENT LIST takes its jobs over.
        On a cluster, one on every master: a queue's mark and its CLIENT LIST are on
        the node that serves the queue's slot."""
        if owner in self._marks:
            held = [await m.wait_held() for m in self._marks[owner].values()]
            return all(held)
        marks: dict[str, rdb.HeldConnection] = {}
        self._marks[owner] = marks
        try:
            for name, node in self._nodes():
                await self._hold_on(owner, name, node)
        except BaseException:
            await self.release(owner)
            raise
        return True

    def _nodes(self) -> list[tuple[str, Any]]:
        """(name, node) of each server that serves queues: the one, or every master."""
        if not self._client.cluster:
            return [("", None)]
        return [(n.name, n) for n in self._redis.get_primaries()]

    def _node_of(self, queue: str) -> tuple[str, Any]:
        if not self._client.cluster:
            return "", None
        node = self._redis.get_node_from_key(self._prefix(queue) + "meta")
        return node.name, node

    def _key_on(self, node: Any, owner: str) -> str:
        """A key nobody writes whose slot ``node`` serves: the mark's read blocks on it."""
        nodes = self._redis.nodes_manager
        for n in range(100_000):
            key = f"herd:live:{{{n}}}:{rdb.mark_name(owner)}"
            if nodes.get_node_from_slot(key_slot(key.encode())).name == node.name:
                return key
        raise BrokerError(f"no slot of {node.name} found for the liveness mark of {owner!r}")

    @staticmethod
    def _on(node: Any) -> dict[str, Any]:
        return {} if node is None else {"target_nodes": node}

    async def _hold_on(self, owner: str, name: str, node: Any) -> None:
        if node is None:
            url, key = self.url, None
        else:
            url, key = rdb.node_url(self.url, node.host, node.port), self._key_on(node, owner)
        mark = rdb.HeldConnection(url, owner, key=key)
        await mark.acquire()
        try:
            with self._errors():
                clients = await self._redis.client_list(_type="normal", **self._on(node))
        except BrokerError:
            clients = []  # CLIENT LIST refused: the check needs it, as takeovers do
        if sum(c.get("name") == mark.name for c in clients) > 1:
            await mark.release()
            raise BrokerError(
                f"worker id {owner!r} is in use by another live process on {mask_url(url)}:"
                " worker ids must be unique per process"
            )
        self._marks[owner][name] = mark

    async def release(self, owner: str) -> None:
        for mark in self._marks.pop(owner, {}).values():
            await mark.release()

    async def live_id(self, owner: str, queue: str) -> str:
        """The CLIENT ID of ``owner``'s mark on the server of ``queue``; a master that
        has none yet (a replica promoted since) gets one now."""
        marks = self._marks.get(owner)
        if marks is None:
            return ""
        name, node = self._node_of(queue)
        if name not in marks:
            try:
                await self._hold_on(owner, name, node)
            except BrokerError as exc:
                log.warning("no liveness mark on %s for %s: %s", name, owner, exc)
                return ""
        mark = marks[name]
        return mark.id if mark.held.is_set() else ""

    async def dead_owners(self, queues: Sequence[str]) -> dict[str, list[str]]:
        """Per queue, the (owner, CLIENT ID) pairs, flat, of marks no longer connected;
        at most every ORPHAN_CHECK seconds (two round trips per server: the owners of
        the queues, then CLIENT LIST ID of theirs only, whatever else is connected)."""
        now = time.monotonic()
        if now < self._next_orphan_check or self._client_list_refused:
            return {}
        self._next_orphan_check = now + ORPHAN_CHECK
        by_node: dict[str, tuple[Any, list[str]]] = {}
        for queue in queues:
            name, node = self._node_of(queue)
            by_node.setdefault(name, (node, []))[1].append(queue)
        dead: dict[str, list[str]] = {}
        for node, group in by_node.values():
            for queue, pairs in (await self._dead_on(node, group)).items():
                dead.setdefault(queue, []).extend(pairs)
        return dead

    async def _owners_on(self, node: Any, queues: Sequence[str]) -> tuple[str, list[Any]]:
        """The server's run id and each queue's owners hash, in one round trip on a
        single server (a cluster pipeline carries no keyless INFO)."""
        if node is None:
            pipe = self._redis.pipeline(transaction=False)
            pipe.info("server")
            for queue in queues:
                pipe.hgetall(self._prefix(queue) + "owners")
            server, *owners = await pipe.execute()
        else:
            server = await self._redis.info("server", target_nodes=node)
            owners = list(
                await asyncio.gather(
                    *(self._redis.hgetall(self._prefix(q) + "owners") for q in queues)
                )
            )
        return str(server.get("run_id", "")), owners

    async def _dead_on(self, node: Any, queues: Sequence[str]) -> dict[str, list[str]]:
        with self._errors():
            run_id, owners = await self._owners_on(node, queues)
            # A mark recorded under another run of the server (before a restart, which
            # dropped every connection, and whose ids new connections may reuse) says
            # nothing until its worker's next heartbeat records the new one.
            run = f"@{run_id}"
            ids = sorted({cid for marks in owners for cid in marks.values() if cid.endswith(run)})
            if not ids:
                return {}
            try:
                found = await self._redis.client_list(
                    client_id=[i.split("@")[0] for i in ids], **self._on(node)
                )
            except rexc.ResponseError as exc:
                # ACLs or a managed server may forbid CLIENT LIST: lease expiry only.
                self._client_list_refused = True
                log.warning(
                    "Redis refused CLIENT LIST (%s): a killed worker's jobs run again only"
                    " once their lease expires",
                    exc,
                )
                return {}
            alive = {(f"{c.get('id')}{run}", str(c.get("name"))) for c in found}
            gone = [
                (queue, owner, cid)
                for queue, marks in zip(queues, owners, strict=True)
                for owner, cid in marks.items()
                if cid.endswith(run) and (cid, rdb.mark_name(owner)) not in alive
            ]
            if gone:
                # A mark remade since (its connection dropped, the process alive) has a
                # new id that the owner records with its next heartbeat: its name says
                # it is there. Rare (after a kill), so the full list is affordable.
                listed = await self._redis.client_list(_type="normal", **self._on(node))
                names = {str(c.get("name")) for c in listed}
                gone = [g for g in gone if rdb.mark_name(g[1]) not in names]
        dead: dict[str, list[str]] = {}
        for queue, owner, cid in gone:
            dead.setdefault(queue, []).extend((owner, cid))
        return dead
