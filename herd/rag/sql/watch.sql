-- The statements of herd.rag.watch (herd ingest --watch and --status).

-- name: claim
-- A watcher takes the collection unless another one was seen within the grace.
INSERT INTO herd_watches AS w (collection, roots, watcher, method)
VALUES (%(c)s, %(roots)s, %(watcher)s, %(method)s)
ON CONFLICT (collection) DO UPDATE SET roots = excluded.roots, watcher = excluded.watcher,
    method = excluded.method, started_at = now(), seen_at = now(), pending = '{}', pending_count = 0,
    pending_since = NULL, syncing_since = NULL, stopped_at = NULL
WHERE w.watcher = excluded.watcher OR w.stopped_at IS NOT NULL
    OR w.seen_at < now() - make_interval(secs => %(grace)s)
RETURNING collection;

-- name: holder
SELECT watcher, seen_at FROM herd_watches WHERE collection = %(c)s;

-- name: heartbeat
UPDATE herd_watches SET seen_at = now() WHERE collection = %(c)s AND watcher = %(watcher)s;

-- name: pending
-- age: how long ago the oldest pending change was seen (the watcher's clock counts
-- durations only; the time is the server's).
UPDATE herd_watches SET pending = %(pending)s, pending_count = %(count)s, seen_at = now(),
    pending_since = now() - make_interval(secs => %(age)s)
WHERE collection = %(c)s AND watcher = %(watcher)s;

-- name: syncing
UPDATE herd_watches SET syncing_since = now(), seen_at = now()
WHERE collection = %(c)s AND watcher = %(watcher)s;

-- name: synced
UPDATE herd_watches SET syncing_since = NULL, last_sync_at = now(), last_sync = %(result)s,
    seen_at = now()
WHERE collection = %(c)s AND watcher = %(watcher)s;

-- name: release
UPDATE herd_watches SET stopped_at = now(), seen_at = now()
WHERE collection = %(c)s AND watcher = %(watcher)s;

-- name: status
SELECT collection, roots, watcher, method, started_at, seen_at, pending, pending_count,
    pending_since,
    syncing_since, last_sync_at, last_sync, stopped_at, now() AS now
FROM herd_watches WHERE collection = %(c)s;

-- name: last_run
SELECT id, status, created_at, finished_at, now() AS now
FROM herd_ingest_runs WHERE collection = %(c)s ORDER BY id DESC LIMIT 1;
