-- Watched collections (herd ingest --watch): one watcher per collection, which
-- records what it has seen and not yet indexed, so `herd ingest --status` can say
-- how far behind the folder the collection is.
CREATE TABLE herd_watches (
    collection    text PRIMARY KEY,
    roots         text[] NOT NULL,
    watcher       text NOT NULL,             -- host:pid
    method        text NOT NULL,             -- events, or poll every N s
    started_at    timestamptz NOT NULL DEFAULT now(),
    seen_at       timestamptz NOT NULL DEFAULT now(),  -- the watcher's heartbeat
    pending       text[] NOT NULL DEFAULT '{}',        -- paths changed, not yet synced (the first 1,000)
    pending_count integer NOT NULL DEFAULT 0,          -- how many there are
    pending_since timestamptz,               -- the oldest of those changes
    syncing_since timestamptz,               -- a sync under way (or cut short by a crash)
    last_sync_at  timestamptz,
    last_sync     jsonb,                     -- what the last sync did
    stopped_at    timestamptz                -- the watcher stopped cleanly
);
