-- Every statement of the exact cache on PostgreSQL, one block per verb.

-- name: get
SELECT value, delta, extract(epoch FROM created_at), extract(epoch FROM expires_at),
       extract(epoch FROM now())
  FROM herd_cache
 WHERE namespace = %(ns)s AND key = %(key)s
   AND (expires_at IS NULL OR expires_at + %(stale)s * interval '1 second' > now());

-- name: put
-- A new row (xmax = 0: inserted, not updated) counts one more entry, in the same statement.
WITH up AS (
    INSERT INTO herd_cache (namespace, key, value, delta, created_at, expires_at, keep_until)
    VALUES (%(ns)s, %(key)s, %(value)s, %(delta)s, now(),
            now() + %(ttl)s::float8 * interval '1 second',
            now() + (%(ttl)s::float8 + %(keep)s) * interval '1 second')
    ON CONFLICT (namespace, key) DO UPDATE
       SET value = excluded.value, delta = excluded.delta, created_at = excluded.created_at,
           expires_at = excluded.expires_at, keep_until = excluded.keep_until
    RETURNING (xmax = 0) AS inserted
)
INSERT INTO herd_cache_stats (namespace, name, value)
SELECT %(ns)s, 'entries', 1 FROM up WHERE inserted
ON CONFLICT (namespace, name) DO UPDATE SET value = herd_cache_stats.value + 1;

-- name: delete
-- Rows of one namespace go with the decrement of its count, in one statement: each
-- touches one counter row, so concurrent deletes and purges never deadlock on them.
WITH d AS (
    DELETE FROM herd_cache
     WHERE namespace = %(ns)s AND (%(keys)s::text[] IS NULL OR key = ANY(%(keys)s))
       AND (NOT %(expired)s OR keep_until < now())
    RETURNING 1
), c AS (SELECT count(*) AS n FROM d),
u AS (
    UPDATE herd_cache_stats s SET value = s.value - c.n FROM c
     WHERE s.namespace = %(ns)s AND s.name = 'entries' AND c.n > 0
)
SELECT n FROM c;

-- name: expired
-- Past their keep_until (expiry plus stale window), oldest first along its index.
SELECT namespace, key FROM herd_cache WHERE keep_until < now()
 ORDER BY keep_until LIMIT %(limit)s;

-- name: count
INSERT INTO herd_cache_stats (namespace, name, value)
SELECT %(ns)s, n, v FROM unnest(%(names)s::text[], %(values)s::bigint[]) AS c(n, v)
ON CONFLICT (namespace, name) DO UPDATE SET value = herd_cache_stats.value + excluded.value;

-- name: namespaces
SELECT namespace FROM herd_cache_stats WHERE name = 'entries' ORDER BY namespace;

-- name: stats
-- 'entries' is one of these rows, kept by every write: O(namespaces), no count(*).
-- It counts rows stored, expired ones included until the next purge.
SELECT namespace, name, value FROM herd_cache_stats;
