"""Corpora that stay current: ``herd ingest DIR --collection C --watch``.

A watcher keeps a collection in step with its folders. It starts with a full sync
(an ordinary ingest of the folders), which also finishes whatever a crashed watcher
left half done: the ledger embeds only chunks not yet embedded at their hash, so
nothing acknowledged is embedded twice. It then waits for changes:

* **Finding them**: filesystem events through ``watchfiles`` (inotify on Linux,
  FSEvents, ReadDirectoryChangesW; a maintained Rust library, idle at ~0% CPU), or
  with ``poll`` a bounded poll every N seconds, for folders where events do not
  arrive (network filesystems).
* **Folding a burst**: changes are collected into a pending set while a sync runs;
  the next sync takes the whole set, so ten saves of three files make one run.
* **A sync** is ``plan_and_apply`` over the changed files only (``changed=``): each
  file is chunked and compared with the collection as in a full run, only new or
  changed chunks are embedded, chunks of deleted files (or no longer produced)
  are removed, and the live generation is updated in place (a new one is built
  only when the spec changes: another embedder or chunker version).

One watcher per collection: it records itself in ``herd_watches`` with a heartbeat,
its pending changes and its last sync, which ``herd ingest --status C`` reads
(``status``). A second watcher is refused while the first is seen; one whose
heartbeat stopped (a crash) is replaced.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import watchfiles
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from herd.app import App
from herd.db.queries import named
from herd.rag.ingest import QUEUE, IngestError, RagRuntime, plan_and_apply
from herd.worker import Worker

log = logging.getLogger("herd.rag.watch")

HEARTBEAT = 10.0
"""Seconds between a watcher's heartbeats while nothing changes."""
GRACE = 3 * HEARTBEAT
"""A watcher not seen for this long is gone: another may take its collection."""
PENDING_SHOWN = 1000
"""Pending paths recorded for ``status`` (all of them are counted)."""


def _sql(name: str) -> str:
    return named("herd.rag.sql")[name]


class WatchError(IngestError):
    """The collection cannot be watched."""


@dataclass
class Sync:
    """What one sync did (a line of ``herd ingest --watch``'s output)."""

    collection: str
    files: int  # the changed paths it covered (-1: the first sync, over every file)
    added: int
    changed: int
    deleted: int
    embedded: int
    generation: int
    lag: float  # seconds from the oldest change it covers to its chunks being searchable
    full: bool = False  # the first sync, over every file
    errors: list[str] = field(default_factory=list)
    dead: int = 0  # embedding jobs that failed for good


def _filter(change: watchfiles.Change, path: str) -> bool:
    # Hidden files are not ingested (see ingest._expand); editors' swap files either.
    name = os.path.basename(path)
    return watchfiles.DefaultFilter()(change, path) and not name.startswith(".")


class Watcher:
    """Keeps ``collection`` in step with ``roots``; ``run`` until ``stop`` is set."""

    def __init__(
        self,
        app: App,
        roots: Sequence[Path],
        collection: str,
        *,
        fmt: str = "auto",
        embedder: str | None = None,
        language: str | None = None,
        concurrency: int = 2,
        poll: float | None = None,
        embed_here: bool = True,
        on_sync: Callable[[Sync], Awaitable[None] | None] | None = None,
    ) -> None:
        self.app, self.collection = app, collection
        self.roots = [Path(r).resolve() for r in roots]
        self.fmt, self.embedder, self.language = fmt, embedder, language
        self.concurrency, self.poll, self.embed_here = concurrency, poll, embed_here
        self.on_sync = on_sync
        self.name = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.method = f"poll every {poll:g} s" if poll else "events"
        self.pending: dict[Path, float] = {}  # path -> when first seen (monotonic)
        self.syncs: list[Sync] = []
        self._wake = asyncio.Event()
        self._store_lock = asyncio.Lock()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        for root in self.roots:
            if not root.is_dir():
                raise WatchError(f"{root}: --watch needs a folder")
        await self._claim()
        try:
            # Events from before the full sync are covered by it: collect from now on.
            ready = asyncio.Event()
            collector = asyncio.create_task(self._collect(stop, ready))
            heartbeat = asyncio.create_task(self._beat(stop))
            try:
                await ready.wait()
                await self._report(await self._sync(None))
                while not stop.is_set():
                    waiter = asyncio.create_task(self._wake.wait())
                    stopper = asyncio.create_task(stop.wait())
                    await asyncio.wait(
                        {waiter, stopper, collector}, return_when=asyncio.FIRST_COMPLETED
                    )
                    waiter.cancel()
                    stopper.cancel()
                    if collector.done():
                        collector.result()  # a watcher that failed: raise it here
                        break
                    if self.pending and not stop.is_set():
                        await self._report(await self._sync_pending())
            finally:
                stop.set()
                for task in (collector, heartbeat):
                    task.cancel()
                await asyncio.gather(collector, heartbeat, return_exceptions=True)
        finally:
            await self._execute("release")

    # -- finding changes

    async def _collect(self, stop: asyncio.Event, ready: asyncio.Event) -> None:
        kwargs: dict[str, Any] = {
            "watch_filter": _filter,
            "stop_event": stop,
            "yield_on_timeout": True,
        }
        if self.poll:
            kwargs.update(force_polling=True, poll_delay_ms=int(self.poll * 1000))
        # rust_timeout: how often the watcher comes back with nothing (yield_on_timeout),
        # which is when `ready` is set: the watch is in place before the full sync reads.
        kwargs["rust_timeout"] = 1000
        async for changes in watchfiles.awatch(*self.roots, **kwargs):
            ready.set()
            if not changes:
                continue
            log.debug("changes in %s: %s", self.collection, changes)
            now = time.monotonic()
            for _, path in changes:
                self.pending.setdefault(Path(path), now)
            self._wake.set()
            await self._record_pending()

    async def _record_pending(self) -> None:
        oldest = min(self.pending.values(), default=None)
        await self._execute(
            "pending",
            pending=sorted(str(p) for p in self.pending)[:PENDING_SHOWN],
            count=len(self.pending),
            age=None if oldest is None else time.monotonic() - oldest,
        )

    async def _beat(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), HEARTBEAT)
            except TimeoutError:
                await self._execute("heartbeat")

    # -- syncing

    async def _sync_pending(self) -> Sync | None:
        self._wake.clear()
        taken = dict(self.pending)
        self.pending.clear()
        done = None
        try:
            done = await self._sync(taken)
        except Exception:
            # Tried again with the next change, or at once if changes wait.
            for path, seen in taken.items():
                self.pending.setdefault(path, seen)
            log.exception(
                "sync of %s failed; its %d changes stay pending", self.collection, len(taken)
            )
            await asyncio.sleep(1.0)  # not a synchronisation: a pause before a retry
            self._wake.set()
        await self._record_pending()
        return done

    async def _sync(self, changed: dict[Path, float] | None) -> Sync:
        start = time.monotonic()
        first = min(changed.values()) if changed else start
        await self._execute("syncing")
        plan = await plan_and_apply(
            self.app,
            self.roots,
            self.collection,
            fmt=self.fmt,
            embedder=self.embedder,
            language=self.language,
            changed=None if changed is None else list(changed),
        )
        dead = await self._embed() if self.embed_here else 0
        done = Sync(
            self.collection,
            files=len(changed) if changed is not None else -1,
            added=plan.added,
            changed=plan.changed,
            deleted=plan.deleted,
            embedded=plan.to_embed,
            generation=plan.generation,
            lag=round(time.monotonic() - first, 3),
            full=changed is None,
            errors=plan.errors,
            dead=dead,
        )
        self.syncs.append(done)
        await self._execute("synced", result=Jsonb(asdict(done)))
        return done

    async def _report(self, done: Sync | None) -> None:
        # Outside the sync's retry: a report that fails (stdout gone) ends the watch.
        if done is not None and self.on_sync is not None:
            result = self.on_sync(done)
            if result is not None:
                await result

    async def _embed(self) -> int:
        stats = await Worker(
            self.app,
            queues=[QUEUE],
            concurrency=self.concurrency,
            stop_when_idle=True,
            poll_interval=0.05,
            install_signal_handlers=False,
        ).run()
        return stats.dead

    # -- the record in herd_watches

    async def _claim(self) -> None:
        rt = await RagRuntime.of(self.app)
        async with rt.store.connection() as conn:
            cur = await conn.execute(
                _sql("claim"),
                {
                    "c": self.collection,
                    "roots": [str(r) for r in self.roots],
                    "watcher": self.name,
                    "method": self.method,
                    "grace": GRACE,
                },
            )
            if await cur.fetchone() is None:
                cur = await conn.execute(_sql("holder"), {"c": self.collection})
                row = await cur.fetchone()
                holder = row[0] if row else "another watcher"
                raise WatchError(
                    f"collection {self.collection!r} is watched by {holder}; stop it first"
                    f" (a watcher not seen for {GRACE:g} s is replaced)"
                )

    async def _execute(self, name: str, **params: Any) -> None:
        rt = await RagRuntime.of(self.app)
        async with self._store_lock, rt.store.connection() as conn:
            await conn.execute(_sql(name), {"c": self.collection, "watcher": self.name, **params})


async def status(app: App, collection: str) -> dict[str, Any]:
    """What ``herd ingest --status C`` shows: the watcher, the last sync, pending changes
    and the lag (how long the oldest pending change has waited), all in server time."""
    rt = await RagRuntime.of(app)
    async with rt.store.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(_sql("status"), {"c": collection})
        row = await cur.fetchone()
        await cur.execute(_sql("last_run"), {"c": collection})
        run = await cur.fetchone()
    live = await rt.store.live(collection)
    out: dict[str, Any] = {
        "collection": collection,
        "now": row["now"] if row else (run["now"] if run else None),
        "generation": live.id if live else None,
        "watched": False,
        "last_run": run and {k: run[k] for k in ("id", "status", "finished_at")},
    }
    if row is None:
        return out
    now = row["now"]
    alive = row["stopped_at"] is None and (now - row["seen_at"]).total_seconds() < GRACE
    pending = row["pending_count"]
    out.update(
        watched=alive,
        watcher=row["watcher"],
        method=row["method"],
        roots=list(row["roots"]),
        started_at=row["started_at"],
        seen_at=row["seen_at"],
        stopped_at=row["stopped_at"],
        last_sync_at=row["last_sync_at"],
        last_sync=row["last_sync"],
        pending=pending,
        pending_files=list(row["pending"])[:20],
        syncing_for=_seconds(now, row["syncing_since"]),
        lag=_seconds(now, row["pending_since"]) if pending else 0.0,
    )
    return out


def _seconds(now: Any, since: Any) -> float | None:
    return None if since is None else round((now - since).total_seconds(), 3)


__all__ = ["GRACE", "HEARTBEAT", "Sync", "WatchError", "Watcher", "status"]
