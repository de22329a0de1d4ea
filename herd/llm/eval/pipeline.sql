-- Every statement on the pipeline tables (herd_eval_pipelines, herd_eval_pieces,
-- herd_eval_fanin), and on a pipeline document's item; sent by herd.llm.eval.stages.

-- name: put_pipeline
INSERT INTO herd_eval_pipelines (hash, pipeline) VALUES (%(hash)s, %(pipeline)s)
ON CONFLICT (hash) DO UPDATE SET created_at = now();

-- name: pipeline
SELECT pipeline FROM herd_eval_pipelines WHERE hash = %(hash)s;

-- name: batch_pipeline
-- A batch has one pipeline: its first document's, along herd_eval_items_staged (3016).
SELECT pipeline FROM herd_eval_items WHERE batch = %(b)s AND pipeline IS NOT NULL LIMIT 1;

-- name: batches_pipelines
-- The pipeline of each batch given that has one, a probe of herd_eval_items_staged each.
SELECT b, (SELECT pipeline FROM herd_eval_items
            WHERE batch = b AND pipeline IS NOT NULL LIMIT 1)
  FROM unnest(%(batches)s::text[]) AS b;

-- name: put_doc_item
-- A pipeline's document: its one item (its final answer lands here), no job of its own
-- (0: the settling of single-prompt items by their job never matches it).
INSERT INTO herd_eval_items (batch, path, key, job_id, doc, spec, pipeline)
VALUES (%(b)s, %(path)s, %(key)s, 0, %(doc)s, %(spec)s, %(pipeline)s)
ON CONFLICT DO NOTHING;

-- name: put_pieces
INSERT INTO herd_eval_pieces (batch, path, stage, round, seq, key, spec, doc, loc)
SELECT %(b)s, %(path)s, %(stage)s, %(round)s, s, k, %(spec)s, d, l
  FROM unnest(%(seqs)s::int[], %(keys)s::text[], %(docs)s::text[], %(locs)s::jsonb[])
       AS x(s, k, d, l)
ON CONFLICT DO NOTHING;

-- name: put_fanin
-- A map stage's count (round 1) at submission.
INSERT INTO herd_eval_fanin (batch, path, stage, open, total)
VALUES (%(b)s, %(path)s, %(stage)s, %(n)s, %(n)s) ON CONFLICT DO NOTHING;

-- name: put_round_fanin
-- The count of a reduce's round of more than one piece, or of a later map's pieces.
INSERT INTO herd_eval_fanin (batch, path, stage, round, open, total)
VALUES (%(b)s, %(path)s, %(stage)s, %(round)s, %(open)s, %(n)s) ON CONFLICT DO NOTHING;

-- name: unsent
-- Pieces decided but not yet enqueued (of a document; of a batch: path NULL).
SELECT path, stage, round, seq, key, spec, doc, chunk FROM herd_eval_pieces
 WHERE batch = %(b)s AND (%(path)s::text IS NULL OR path = %(path)s)
   AND job_id IS NULL AND status = 'queued'
 ORDER BY path, stage, round, seq;

-- name: sent
-- The jobs the pieces given were sent to: one statement for a document's pieces.
UPDATE herd_eval_pieces p SET job_id = s.job
  FROM unnest(%(jobs)s::bigint[], %(paths)s::text[], %(stages)s::text[], %(rounds)s::int[],
              %(seqs)s::int[]) AS s(job, path, stage, round, seq)
 WHERE p.batch = %(b)s AND p.path = s.path AND p.stage = s.stage AND p.round = s.round
   AND p.seq = s.seq AND p.job_id IS NULL;

-- name: piece
SELECT status, key, spec, doc FROM herd_eval_pieces
 WHERE batch = %(b)s AND path = %(path)s AND stage = %(stage)s AND round = %(round)s
   AND seq = %(seq)s;

-- name: piece_end
-- The one transition a piece makes (queued -> done or failed): only the run that makes
-- it counts the piece in its document's fan-in.
UPDATE herd_eval_pieces SET status = %(status)s, source = %(source)s, result = %(result)s,
       error = %(error)s, finished_at = now()
 WHERE batch = %(b)s AND path = %(path)s AND stage = %(stage)s AND round = %(round)s
   AND seq = %(seq)s AND status = 'queued'
RETURNING seq;

-- name: fanin_step
-- No row: the stage's round is one piece (a reduce, a chain), nothing to count.
UPDATE herd_eval_fanin SET open = open - 1
 WHERE batch = %(b)s AND path = %(path)s AND stage = %(stage)s AND round = %(round)s
RETURNING open;

-- name: stage_answers
-- A document's pieces of a stage's round in document order: what the next reads.
SELECT seq, status, result, error, loc FROM herd_eval_pieces
 WHERE batch = %(b)s AND path = %(path)s AND stage = %(stage)s AND round = %(round)s
 ORDER BY seq;

-- name: doc_done
UPDATE herd_eval_items SET status = 'done', source = %(source)s, result = %(result)s,
       finished_at = now()
 WHERE batch = %(b)s AND path = %(path)s AND status IN ('queued', 'parked');

-- name: doc_failed
UPDATE herd_eval_items SET status = 'failed', result = %(result)s, finished_at = now()
 WHERE batch = %(b)s AND path = %(path)s AND status IN ('queued', 'parked');

-- name: cancel_pieces
UPDATE herd_eval_pieces SET status = 'cancelled', finished_at = now()
 WHERE batch = %(b)s AND path = %(path)s AND stage = %(stage)s AND round = %(round)s
   AND seq = %(seq)s AND status = 'queued';

-- name: stage_counts
-- Per stage: pieces, done, failed, cancelled, cached, the last round made, of a batch;
-- from the counters (3021): a few rows per stage, whatever the number of pieces.
SELECT stage, sum(n), coalesce(sum(n) FILTER (WHERE status = 'done'), 0),
       coalesce(sum(n) FILTER (WHERE status = 'failed'), 0),
       coalesce(sum(n) FILTER (WHERE status = 'cancelled'), 0),
       coalesce(sum(n) FILTER (WHERE cached), 0), max(round)
  FROM (SELECT stage, round, status, cached, sum(n) AS n FROM herd_eval_piece_counts
         WHERE batch = %(b)s GROUP BY stage, round, status, cached HAVING sum(n) <> 0) c
 GROUP BY stage;

-- name: stage_costs
-- Per stage, what its calls cost this batch (paid calls: the ledger's rows of its
-- pieces' keys, or of its pieces' jobs), from the totals kept as they close (3021).
SELECT stage, sum(n), sum(input_tokens), sum(output_tokens), sum(cost), sum(unpriced) > 0
  FROM herd_eval_stage_costs WHERE batch = %(b)s GROUP BY stage;

-- name: stage_failures
SELECT path, stage, seq, loc, error FROM herd_eval_pieces
 WHERE batch = %(b)s AND status = 'failed' ORDER BY path, stage, round, seq
 LIMIT %(limit)s;

-- name: failed_docs
SELECT path, result FROM herd_eval_items
 WHERE batch = %(b)s AND status = 'failed' ORDER BY path LIMIT %(limit)s;

-- name: failed_count
-- From the item counters (3016), not a count of the batch's items.
SELECT coalesce(sum(n), 0) FROM herd_eval_item_counts WHERE batch = %(b)s AND status = 'failed';

-- name: stage_results
-- A stage's answers per piece (a reduce's by round), with where each piece came from.
SELECT path, round, seq, status, source, result, error, loc FROM herd_eval_pieces
 WHERE batch = %(b)s AND stage = %(stage)s
   AND (%(after)s::text IS NULL
        OR (path, round, seq) > (%(after)s, %(after_round)s, %(after_seq)s))
 ORDER BY path, round, seq LIMIT %(limit)s;

-- name: sweep_pieces
-- The next waiting pieces sent to a job, after the last one swept (along
-- herd_eval_pieces_waiting, 3021): the status read's sweep of their jobs.
SELECT path, stage, round, seq, job_id FROM herd_eval_pieces
 WHERE batch = %(b)s AND status = 'queued' AND job_id IS NOT NULL
   AND (NOT %(after)s OR (path, stage, round, seq) > (%(path)s, %(stage)s, %(round)s, %(seq)s))
 ORDER BY path, stage, round, seq LIMIT %(limit)s;

-- name: running_documents
-- Per batch of those given (all: NULL), its documents with a piece on one of the leased
-- jobs given, along herd_eval_pieces_job (3021): a pipeline's running documents.
SELECT batch, count(DISTINCT path) FROM herd_eval_pieces
 WHERE job_id = ANY(%(jobs)s::bigint[]) AND status = 'queued'
   AND (%(batches)s::text[] IS NULL OR batch = ANY(%(batches)s::text[]))
 GROUP BY batch;

-- name: waiting_pieces
-- The pieces of a batch not answered whose job is one of the dead ones given, along
-- herd_eval_pieces_job (3021).
SELECT path, stage, round, seq, job_id FROM herd_eval_pieces
 WHERE job_id = ANY(%(jobs)s::bigint[]) AND batch = %(b)s AND status = 'queued';

-- name: doc_calls
-- What each document's calls cost over all its stages (a key it shares with another
-- document counted for both; a fallback's call found by its piece's job), in the shape
-- of queries.sql's key_calls.
WITH l AS (SELECT * FROM herd_eval_ledger
            WHERE batch = %(b)s AND state = 'closed'
              AND kind IN ('call', 'lost', 'failed', 'cut_short')),
     x AS (SELECT p.path, l.id, l.input_tokens, l.cached_input_tokens, l.output_tokens,
                  l.cost, l.at
             FROM (SELECT DISTINCT path, key FROM herd_eval_pieces
                    WHERE batch = %(b)s AND path = ANY(%(paths)s)) p
             JOIN l ON l.key = p.key
           UNION
           SELECT p.path, l.id, l.input_tokens, l.cached_input_tokens, l.output_tokens,
                  l.cost, l.at
             FROM (SELECT DISTINCT path, job_id FROM herd_eval_pieces
                    WHERE batch = %(b)s AND path = ANY(%(paths)s) AND job_id IS NOT NULL) p
             JOIN l ON l.job_id = p.job_id)
SELECT path, sum(input_tokens), sum(cached_input_tokens), sum(output_tokens),
       sum(cost), bool_or(cost IS NULL), min(at), max(at), count(*)
  FROM x GROUP BY path;

-- Retention (herd.llm.eval.store.purge, HERD_EVAL_TTL): a document's pieces and fan-in
-- go with its item (purged HERD_EVAL_TTL after it finished); a pipeline no item names
-- goes after HERD_EVAL_TTL.

-- name: purge_pieces
DELETE FROM herd_eval_pieces WHERE (batch, path, stage, round, seq) IN (
    SELECT batch, path, stage, round, seq FROM herd_eval_pieces p
     WHERE NOT EXISTS (SELECT 1 FROM herd_eval_items i
                        WHERE i.batch = p.batch AND i.path = p.path)
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_stage_counts
-- A batch's counters and stage totals go once it has no item and no piece left.
DELETE FROM herd_eval_piece_counts WHERE (batch, stage, round, status, cached, slot) IN (
    SELECT batch, stage, round, status, cached, slot FROM herd_eval_piece_counts c
     WHERE NOT EXISTS (SELECT 1 FROM herd_eval_items i WHERE i.batch = c.batch)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_pieces p WHERE p.batch = c.batch)
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_stage_costs
DELETE FROM herd_eval_stage_costs WHERE (batch, stage, slot) IN (
    SELECT batch, stage, slot FROM herd_eval_stage_costs c
     WHERE NOT EXISTS (SELECT 1 FROM herd_eval_items i WHERE i.batch = c.batch)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_pieces p WHERE p.batch = c.batch)
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_fanin
DELETE FROM herd_eval_fanin WHERE (batch, path, stage, round) IN (
    SELECT batch, path, stage, round FROM herd_eval_fanin f
     WHERE NOT EXISTS (SELECT 1 FROM herd_eval_items i
                        WHERE i.batch = f.batch AND i.path = f.path)
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_pipelines
DELETE FROM herd_eval_pipelines WHERE hash IN (
    SELECT hash FROM herd_eval_pipelines p
     WHERE created_at < now() - make_interval(secs => %(keep)s)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_items i WHERE i.pipeline = p.hash)
     ORDER BY created_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- A stage through the Batch API (herd.llm.eval.pipebatch): its pieces gathered into
-- chunks, one provider batch each, settled by the chunk's poll job.

-- name: gather_keys
-- The keys of a batch's pieces of the stages named, decided and not yet gathered.
SELECT DISTINCT key, spec FROM herd_eval_pieces
 WHERE batch = %(b)s AND stage = ANY(%(stages)s) AND job_id IS NULL AND status = 'queued'
   AND chunk IS NULL;

-- name: gather
-- Concurrent gatherers take disjoint pieces: a row another took is skipped (re-checked
-- after its lock), so a piece is in one chunk ('sync': its own job) only.
UPDATE herd_eval_pieces SET chunk = %(chunk)s
 WHERE batch = %(b)s AND stage = ANY(%(stages)s) AND key = ANY(%(keys)s)
   AND spec = %(spec)s AND job_id IS NULL AND status = 'queued' AND chunk IS NULL
RETURNING key;

-- name: unsent_chunks
SELECT chunk, spec, array_agg(DISTINCT key ORDER BY key) FROM herd_eval_pieces
 WHERE batch = %(b)s AND job_id IS NULL AND status = 'queued' AND chunk IS NOT NULL
   AND chunk <> 'sync'
 GROUP BY chunk, spec ORDER BY chunk;

-- name: chunk_sent
-- To its submit job, then (chunk_moved) its poll job: status settles a dead one's pieces.
UPDATE herd_eval_pieces SET job_id = %(job)s WHERE chunk = %(chunk)s AND status = 'queued';

-- name: chunk_piece_requests
SELECT DISTINCT ON (p.key) p.key, d.text FROM herd_eval_pieces p
  JOIN herd_eval_documents d ON d.hash = p.doc
 WHERE p.chunk = %(chunk)s AND p.key = ANY(%(keys)s);

-- name: chunk_key_end
-- A key's answer (or failure) ends every piece of the chunk that asked it, each once.
UPDATE herd_eval_pieces SET status = %(status)s, source = %(source)s, result = %(result)s,
       error = %(error)s, finished_at = now()
 WHERE chunk = %(chunk)s AND key = %(key)s AND status = 'queued'
RETURNING path, stage, round;

-- name: chunk_to_sync
-- Keys the provider batch failed: retried once by a job each (sent after the commit).
UPDATE herd_eval_pieces SET chunk = 'sync', job_id = NULL
 WHERE chunk = %(chunk)s AND key = ANY(%(keys)s) AND status = 'queued';

-- name: chunk_cancel
UPDATE herd_eval_pieces SET status = 'cancelled', finished_at = now()
 WHERE chunk = %(chunk)s AND status = 'queued';

-- name: cancel_ungathered
-- A cancelled batch gathers nothing more: its waiting pieces of batched stages end here.
UPDATE herd_eval_pieces SET status = 'cancelled', finished_at = now()
 WHERE batch = %(b)s AND stage = ANY(%(stages)s) AND job_id IS NULL AND status = 'queued'
   AND (chunk IS NULL OR chunk <> 'sync');
