-- Every statement of the corpus index (herd.rag), one block per verb. Read by
-- herd.db.queries.named("herd.rag.sql"). A block with {t} (a generation's table,
-- herd_vectors_<id>) or another {name} is completed with psycopg.sql's format.
-- A run's deletion scope is the files it read and whatever lies under the folders
-- it was given: folders compare as plain prefixes (under LIKE, the _, % and \ of a
-- folder's name would be wildcards reaching into its neighbours).

-- ---------------------------------------------------------------- generations

-- name: live_generation
SELECT g.* FROM herd_generations g JOIN herd_collections c ON c.live_generation = g.id
 WHERE c.name = %s;

-- name: active_generations
SELECT * FROM herd_generations WHERE collection = %s AND status <> 'retired' ORDER BY id;

-- name: generation
SELECT * FROM herd_generations WHERE id = %s;

-- name: building_generation
SELECT * FROM herd_generations
 WHERE collection = %s AND fingerprint = %s AND status = 'building'
 ORDER BY id DESC LIMIT 1;

-- name: add_collection
INSERT INTO herd_collections (name) VALUES (%s) ON CONFLICT DO NOTHING;

-- name: add_generation
INSERT INTO herd_generations (collection, fingerprint, settings, dim)
VALUES (%s, %s, %s, %s) RETURNING id;

-- name: create_generation_table
CREATE TABLE {t} (chunk_id text PRIMARY KEY, hash text NOT NULL, lexemes tsvector NOT NULL);

-- name: index_lexemes
-- Unlike HNSW, a GIN index takes single inserts cheaply (its pending list).
CREATE INDEX {index} ON {t} USING gin (lexemes);

-- name: retired_to_drop
SELECT * FROM herd_generations
 WHERE status = 'retired' AND dropped_at IS NULL
   AND (retired_at IS NULL OR retired_at <= now() - make_interval(secs => %s))
 ORDER BY id;

-- name: drop_generation_table
DROP TABLE IF EXISTS {t};

-- name: mark_dropped
UPDATE herd_generations SET dropped_at = now() WHERE id = %s;

-- name: unretired_generation_ids
SELECT id FROM herd_generations WHERE collection = %s AND status <> 'retired';

-- ---------------------------------------------------------------- the swap

-- name: lock_collection
SELECT 1 FROM herd_collections WHERE name = %s FOR UPDATE;

-- name: swap_check
-- Chunks and vectors counted and checksummed over (chunk id, hash), both sides.
SELECT (SELECT count(*) FROM herd_chunks WHERE collection = %(c)s),
       (SELECT count(*) FROM {t}),
       (SELECT md5(string_agg(chunk_id || hash, ',' ORDER BY chunk_id))
          FROM herd_chunks WHERE collection = %(c)s),
       (SELECT md5(string_agg(chunk_id || hash, ',' ORDER BY chunk_id)) FROM {t});

-- name: make_live
UPDATE herd_generations SET status = 'live', swapped_at = now()
 WHERE id = %s AND status = 'building';

-- name: retire_others
UPDATE herd_generations SET status = 'retired', retired_at = now()
 WHERE collection = %s AND status = 'live' AND id <> %s;

-- name: point_collection
UPDATE herd_collections SET live_generation = %s WHERE name = %s;

-- ---------------------------------------------------------------- a generation's rows

-- name: upsert_lexemes
-- The catalogue rows of a store outside PostgreSQL, written after its vectors.
INSERT INTO {t} (chunk_id, hash, lexemes)
SELECT i, h, to_tsvector({language}::regconfig, t)
  FROM unnest(%s::text[], %s::text[], %s::text[]) AS r(i, h, t)
ON CONFLICT (chunk_id) DO UPDATE SET hash = excluded.hash, lexemes = excluded.lexemes;

-- name: missing
SELECT c.chunk_id, c.hash, c.part FROM herd_chunks c
  LEFT JOIN {t} v ON v.chunk_id = c.chunk_id AND v.hash = c.hash
 WHERE c.collection = %s AND v.chunk_id IS NULL
 ORDER BY c.part, c.chunk_id;

-- name: count_missing
SELECT count(*) FROM herd_chunks c
  LEFT JOIN {t} v ON v.chunk_id = c.chunk_id AND v.hash = c.hash
 WHERE c.collection = %s AND v.chunk_id IS NULL;

-- name: embedded
SELECT v.chunk_id FROM {t} v
  JOIN unnest(%s::text[], %s::text[]) AS i(id, hash) ON v.chunk_id = i.id AND v.hash = i.hash;

-- name: to_embed
-- An embed job's items still current (their hash) and without a vector at that hash
-- in the generation: the texts to embed, in one round trip.
SELECT c.chunk_id, c.hash, c.text FROM herd_chunks c
  JOIN unnest(%s::text[], %s::text[]) AS i(id, hash) ON c.chunk_id = i.id AND c.hash = i.hash
 WHERE c.collection = %s
   AND NOT EXISTS (SELECT 1 FROM {t} v WHERE v.chunk_id = c.chunk_id AND v.hash = c.hash)
 ORDER BY c.chunk_id;

-- name: rows_of
SELECT chunk_id, hash FROM {t};

-- name: delete_rows
DELETE FROM {t} WHERE chunk_id = ANY(%s);

-- ---------------------------------------------------------------- chunks

-- name: chunks_by_id
SELECT c.chunk_id, c.breadcrumb, c.text, c.metadata FROM herd_chunks c
  JOIN unnest(%s::text[]) AS i(id) ON c.chunk_id = i.id
 WHERE c.collection = %s;

-- name: units
-- Chunks whose ids match any of the LIKE patterns, in the patterns' order.
SELECT c.chunk_id, c.breadcrumb, c.text, c.metadata FROM herd_chunks c
  JOIN unnest(%s::text[]) WITH ORDINALITY AS p(pattern, n) ON c.chunk_id LIKE p.pattern
 WHERE c.collection = %s
 ORDER BY p.n, c.chunk_id LIMIT 50;

-- name: text_search_configs
SELECT cfgname FROM pg_ts_config;

-- name: bm25
-- BM25 (k1 1.2, b 0.75) over the generation's lexemes. A query term is a group of
-- lexemes that count as one word (herd.rag.variants: neighbor and neighbour, love and
-- loveth): each lexeme of %(q)s with the forms that the (word, form) pairs of
-- %(words)s and %(forms)s give its word. A group's df counts the chunks holding any
-- of its lexemes, its tf a chunk's occurrences of all of them. ``matched``: the share
-- of the query's idf that the chunk holds (a group no chunk holds counts at its full
-- idf), by which hybrid fusion weighs the lexical ranking. A lexeme becomes a tsquery
-- operand quoted, so that no character of it is an operator.
WITH terms AS (
    SELECT DISTINCT lex AS term
    FROM unnest(tsvector_to_array(to_tsvector(%(cfg)s::regconfig, %(q)s))) AS lex
), alts AS (
    SELECT DISTINCT w.lex AS term, f.lex
    FROM unnest(%(words)s::text[], %(forms)s::text[]) AS p(word, form)
    CROSS JOIN LATERAL unnest(tsvector_to_array(to_tsvector(%(cfg)s::regconfig, p.word))) AS w(lex)
    CROSS JOIN LATERAL unnest(tsvector_to_array(to_tsvector(%(cfg)s::regconfig, p.form))) AS f(lex)
), grouped AS (
    SELECT DISTINCT lexes FROM (
        SELECT array_agg(DISTINCT lex ORDER BY lex) AS lexes
        FROM (SELECT term, term AS lex FROM terms
              UNION SELECT a.term, a.lex FROM alts a JOIN terms USING (term)) AS g
        GROUP BY term
    ) AS d
), groups AS (
    SELECT row_number() OVER (ORDER BY lexes) AS g, lexes,
           (SELECT string_agg('''' || replace(replace(l, '\', '\\'), '''', '''''') || '''', ' | ')
              FROM unnest(lexes) AS l)::tsquery AS tsq
    FROM grouped
), stats AS (
    SELECT count(*)::float8 AS n, greatest(avg(length(lexemes)), 1)::float8 AS avgdl FROM {t}
), idf AS (
    SELECT g, lexes, tsq, df, ln(1 + (stats.n - df + 0.5) / (df + 0.5)) AS idf
    FROM stats, (SELECT g, lexes, tsq, (SELECT count(*) FROM {t} WHERE lexemes @@ tsq) AS df
                   FROM groups) AS counted
), total AS (
    SELECT greatest(sum(idf), 1e-9) AS idf,
           coalesce(sum(idf) FILTER (WHERE df > 0), 0) / greatest(sum(idf), 1e-9) AS found
    FROM idf
), wanted AS (
    SELECT string_agg(tsq::text, ' | ')::tsquery AS tsq FROM idf WHERE df > 0
), member AS (
    SELECT g, unnest(lexes) AS lex, idf FROM idf WHERE df > 0
), per AS (
    SELECT v.chunk_id, m.g, m.idf, sum(cardinality(u.positions)) AS tf,
           length(v.lexemes) AS dl
    FROM wanted, {t} v
    CROSS JOIN LATERAL unnest(v.lexemes) AS u(lexeme, positions, weights)
    JOIN member m ON m.lex = u.lexeme
    WHERE v.lexemes @@ wanted.tsq
    GROUP BY v.chunk_id, m.g, m.idf, length(v.lexemes)
), scored AS (
    SELECT per.chunk_id, sum(per.idf) / total.idf AS matched, total.found, sum(
        per.idf * per.tf * 2.2 / (per.tf + 1.2 * (0.25 + 0.75 * per.dl / stats.avgdl))
    ) AS score
    FROM per, stats, total
    GROUP BY per.chunk_id, total.idf, total.found
    ORDER BY score DESC, per.chunk_id LIMIT %(k)s
)
SELECT s.chunk_id, c.breadcrumb, c.text, s.score, c.metadata, s.matched, s.found
FROM scored s JOIN herd_chunks c ON c.collection = %(c)s AND c.chunk_id = s.chunk_id
ORDER BY s.score DESC, s.chunk_id;

-- ---------------------------------------------------------------- ingest runs

-- name: create_run_table
-- The files a run read, chunked, on this connection only (a temporary table).
CREATE TEMP TABLE IF NOT EXISTS herd_run_chunks (chunk_id text, source text, part text,
    text text, breadcrumb text, metadata jsonb, hash text, ord integer);

-- name: truncate_run_table
TRUNCATE herd_run_chunks;

-- name: copy_run_chunks
COPY herd_run_chunks (chunk_id, source, part, text, breadcrumb, metadata, hash, ord) FROM STDIN;

-- name: forget_run_sources
DELETE FROM herd_run_chunks WHERE source = ANY(%s);

-- name: run_clashing_sources
-- The run's files whose chunk ids another file has: an earlier one of the run (ord:
-- the order the files were given), or one in the collection that this run does not
-- cover (one it covers gives its ids up: a text moved between files).
SELECT source FROM (
    SELECT source, ord, min(ord) OVER (PARTITION BY chunk_id) AS first FROM herd_run_chunks
) r WHERE ord > first
UNION
SELECT r.source FROM herd_run_chunks r
  JOIN herd_chunks c ON c.collection = %(c)s AND c.chunk_id = r.chunk_id
 WHERE c.source <> r.source
   AND NOT (c.source = ANY(%(files)s) OR EXISTS (SELECT 1 FROM unnest(%(folders)s::text[]) AS d(prefix)
            WHERE starts_with(c.source, d.prefix)));

-- name: run_shared_id
SELECT chunk_id, array_agg(source ORDER BY ord) FROM herd_run_chunks
 GROUP BY chunk_id HAVING count(*) > 1 LIMIT 1;

-- name: run_id_taken
SELECT r.chunk_id, c.source, r.source FROM herd_run_chunks r
  JOIN herd_chunks c ON c.collection = %(c)s AND c.chunk_id = r.chunk_id
 WHERE c.source <> r.source
   AND NOT (c.source = ANY(%(files)s) OR EXISTS (SELECT 1 FROM unnest(%(folders)s::text[]) AS d(prefix)
            WHERE starts_with(c.source, d.prefix)))
 LIMIT 1;

-- name: run_changes
-- (added, changed, unchanged) of the run against the collection.
SELECT count(*) FILTER (WHERE c.chunk_id IS NULL), count(*) FILTER (WHERE c.hash <> r.hash),
       count(*) FILTER (WHERE c.hash = r.hash)
  FROM herd_run_chunks r
  LEFT JOIN herd_chunks c ON c.collection = %(c)s AND c.chunk_id = r.chunk_id;

-- name: run_deletions
SELECT count(*) FROM herd_chunks c
 WHERE c.collection = %(c)s
   AND (c.source = ANY(%(files)s) OR EXISTS (SELECT 1 FROM unnest(%(folders)s::text[]) AS d(prefix)
        WHERE starts_with(c.source, d.prefix)))
   AND NOT EXISTS (SELECT 1 FROM herd_run_chunks r WHERE r.chunk_id = c.chunk_id);

-- name: add_run
INSERT INTO herd_ingest_runs (collection, generation, files, folders)
VALUES (%(c)s, %(g)s, %(files)s, %(dirs)s) RETURNING id;

-- name: store_run_chunks
INSERT INTO herd_chunks (collection, chunk_id, source, part, text, breadcrumb, metadata, hash,
                         run_id)
SELECT %(c)s, chunk_id, source, part, text, breadcrumb, metadata, hash, %(run)s
  FROM herd_run_chunks
ON CONFLICT (collection, chunk_id) DO UPDATE
   SET source = excluded.source, part = excluded.part, text = excluded.text,
       breadcrumb = excluded.breadcrumb, metadata = excluded.metadata, hash = excluded.hash,
       run_id = excluded.run_id;

-- name: drop_run_table
DROP TABLE herd_run_chunks;

-- name: run_scope
SELECT files, folders FROM herd_ingest_runs WHERE id = %s;

-- name: delete_unseen
-- The chunks in the run's scope that an earlier run stored and this one did not see.
DELETE FROM herd_chunks c
 WHERE c.collection = %(c)s AND c.run_id < %(run)s
   AND (c.source = ANY(%(files)s) OR EXISTS (SELECT 1 FROM unnest(%(folders)s::text[]) AS d(prefix)
        WHERE starts_with(c.source, d.prefix)))
RETURNING chunk_id;

-- name: finish_run
UPDATE herd_ingest_runs SET status = 'done', finished_at = now() WHERE id = %s;

-- ---------------------------------------------------------------- pgvector (herd.rag.vectors.pgvector)

-- name: pgvector_add_column
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS embedding vector({dim}) NOT NULL;

-- name: pgvector_upsert
-- Vectors, hashes and lexemes in one statement, in the caller's (fenced) transaction.
INSERT INTO {t} (chunk_id, hash, embedding, lexemes)
SELECT i, h, e, to_tsvector({language}::regconfig, t)
  FROM unnest(%s::text[], %s::text[], %b::vector[], %s::text[]) AS r(i, h, e, t)
ON CONFLICT (chunk_id) DO UPDATE
   SET hash = excluded.hash, embedding = excluded.embedding, lexemes = excluded.lexemes;

-- name: pgvector_lock_for_index
-- Self-conflicting: two finalizers never build the same index twice.
LOCK TABLE {t} IN SHARE ROW EXCLUSIVE MODE;

-- name: pgvector_has_index
SELECT 1 FROM pg_indexes
 WHERE schemaname = current_schema() AND tablename = %s AND indexdef LIKE '%%USING hnsw%%';

-- name: pgvector_index_memory
-- The graph of a large corpus outgrows the default 64 MB and the build then slows
-- down by an order of magnitude.
SET LOCAL maintenance_work_mem = '512MB';

-- name: pgvector_index
CREATE INDEX {index} ON {t} USING hnsw (embedding vector_cosine_ops);

-- name: pgvector_ef_search
SET LOCAL hnsw.ef_search = {ef};

-- name: pgvector_search
SELECT chunk_id, 1 - (embedding <=> %(q)s) FROM {t} ORDER BY embedding <=> %(q)s LIMIT %(k)s;

-- The watcher's state (herd.rag.watch): one row per watched collection.
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
