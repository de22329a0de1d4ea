-- Retention and O(1) statistics for the exact cache (herd.cache.postgres).

-- keep_until: when the row may go, its expiry plus the stale-while-revalidate window
-- it was written with (NULL: kept until cleared). The store purges past it, a
-- bounded batch at a time along this index.
ALTER TABLE herd_cache ADD COLUMN keep_until timestamptz;
UPDATE herd_cache SET keep_until = expires_at WHERE expires_at IS NOT NULL;
CREATE INDEX herd_cache_keep_until ON herd_cache (keep_until) WHERE keep_until IS NOT NULL;
DROP INDEX IF EXISTS herd_cache_expiry;  -- nothing reads by expires_at alone

-- The number of rows per namespace, as the counter 'entries' beside the hit counters,
-- kept by every insert, delete, clear and purge in its own statement: stats() reads
-- O(namespaces) rows instead of counting the table. Counted once here.
INSERT INTO herd_cache_stats (namespace, name, value)
SELECT namespace, 'entries', count(*) FROM herd_cache GROUP BY namespace
ON CONFLICT (namespace, name) DO UPDATE SET value = excluded.value;
