-- Every statement of the semantic cache on pgvector (herd.semantic.postgres), one
-- block per verb. Read by herd.db.queries.named("herd.semantic.sql"); {dim} and
-- {name} are completed with psycopg.sql's format.

-- name: create_index
-- One HNSW index per dimension, over the rows of that dimension.
CREATE INDEX IF NOT EXISTS {name} ON herd_semantic
 USING hnsw ((vec::vector({dim})) vector_cosine_ops) WHERE dim = {dim};

-- name: index_lock
SELECT pg_advisory_xact_lock(%s);

-- name: server_time
SELECT extract(epoch FROM clock_timestamp())::float8;

-- name: search_settings
-- relaxed_order: the cache re-scores the candidates itself, so strict order is not
-- needed; iterative scans keep going until enough rows pass the scope's filter.
SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true),
       set_config('hnsw.ef_search', '64', true);

-- name: search
SELECT id, query, guard, value, vec, delta, created_at, expires_at,
       1 - (vec::vector({dim}) <=> %(v)s::vector({dim})), verdicts
  FROM herd_semantic
 WHERE cache = %(cache)s AND dim = {dim} AND tenant = %(tenant)s AND embedder = %(embedder)s
   AND collection = %(collection)s AND generation = %(generation)s
   AND expires_at > %(alive)s
 ORDER BY vec::vector({dim}) <=> %(v)s::vector({dim})
 LIMIT %(k)s;

-- name: upsert
INSERT INTO herd_semantic (cache, id, tenant, embedder, collection, generation, scope, dim,
                           query, guard, value, vec, delta, created_at, expires_at, keep_until,
                           last_used)
VALUES (%(cache)s, %(id)s, %(tenant)s, %(embedder)s, %(collection)s, %(generation)s, %(scope)s,
        %(dim)s, %(query)s, %(guard)s, %(value)s, %(v)s, %(delta)s, %(created)s, %(expires)s,
        %(keep)s, %(now)s)
ON CONFLICT (cache, id) DO UPDATE
   SET query = excluded.query, guard = excluded.guard, value = excluded.value,
       vec = excluded.vec, delta = excluded.delta, created_at = excluded.created_at,
       expires_at = excluded.expires_at, keep_until = excluded.keep_until,
       last_used = excluded.last_used, verdicts = '[]'
RETURNING xmax = 0;

-- name: grow
INSERT INTO herd_semantic_sizes (cache, n) VALUES (%(cache)s, 1)
ON CONFLICT (cache) DO UPDATE SET n = herd_semantic_sizes.n + 1
RETURNING n;

-- name: evict
-- Past the bound: first what outlived its stale window, then the least recently used.
WITH gone AS (
  DELETE FROM herd_semantic WHERE cache = %(cache)s AND keep_until < %(now)s RETURNING 1
), oldest AS (
  DELETE FROM herd_semantic WHERE (cache, id) IN (
    SELECT cache, id FROM herd_semantic WHERE cache = %(cache)s AND id <> %(keep)s
       AND keep_until >= %(now)s
     ORDER BY last_used LIMIT %(over)s FOR UPDATE SKIP LOCKED)
  RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM oldest);

-- name: shrink
UPDATE herd_semantic_sizes SET n = n - %(d)s WHERE cache = %(cache)s;

-- name: touch
UPDATE herd_semantic s
   SET last_used = greatest(s.last_used, u.at),
       expires_at = coalesce(u.expires, s.expires_at),
       keep_until = coalesce(u.keep, s.keep_until)
  FROM unnest(%(ids)s::text[], %(at)s::float8[], %(expires)s::float8[], %(keep)s::float8[])
       AS u(id, at, expires, keep)
 WHERE s.cache = %(cache)s AND s.id = u.id;

-- name: judge
-- The newest ``keep`` verdicts, oldest first.
UPDATE herd_semantic
   SET verdicts = (SELECT coalesce(jsonb_agg(v ORDER BY o), '[]'::jsonb)
                     FROM (SELECT v, o FROM jsonb_array_elements(verdicts || %(new)s)
                                  WITH ORDINALITY AS t(v, o)
                            ORDER BY o DESC LIMIT %(keep)s) AS newest)
 WHERE cache = %(cache)s AND id = %(id)s;

-- name: clear
WITH d AS (
  DELETE FROM herd_semantic
   WHERE (%(c)s::text IS NULL OR cache = %(c)s)
     AND (%(col)s::text IS NULL OR scope->>'collection' = %(col)s)
  RETURNING 1
)
SELECT count(*) FROM d;

-- name: recount
UPDATE herd_semantic_sizes z
   SET n = (SELECT count(*) FROM herd_semantic s WHERE s.cache = z.cache)
 WHERE %(c)s::text IS NULL OR z.cache = %(c)s;

-- name: count
INSERT INTO herd_semantic_stats (cache, name, value)
SELECT %(cache)s, n, v FROM unnest(%(names)s::text[], %(values)s::bigint[]) AS c(n, v)
ON CONFLICT (cache, name) DO UPDATE SET value = herd_semantic_stats.value + excluded.value;

-- name: read_stats
-- The counters, then each cache's size (kept by every write and purge, which the size
-- bound reads too: O(caches) rows, no count of the entries), in one round trip.
SELECT cache, name, value FROM (
    SELECT cache, name, value, 0 AS part FROM herd_semantic_stats
    UNION ALL
    SELECT cache, 'entries', n, 1 FROM herd_semantic_sizes
) AS t ORDER BY part;
