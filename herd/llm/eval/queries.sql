-- Every statement on the herd_eval_* tables, one block per verb (herd.llm.eval.store and
-- herd.llm.eval.ledger send them; nothing else writes these tables).

-- name: put_documents
-- A submission refreshes created_at: retention counts from the last one.
INSERT INTO herd_eval_documents (hash, text)
SELECT * FROM unnest(%(hashes)s::text[], %(texts)s::text[])
ON CONFLICT (hash) DO UPDATE SET created_at = now();

-- name: put_spec
INSERT INTO herd_eval_specs (hash, spec) VALUES (%(hash)s, %(spec)s)
ON CONFLICT (hash) DO UPDATE SET created_at = now();

-- name: document
SELECT text FROM herd_eval_documents WHERE hash = %(hash)s;

-- name: spec
SELECT spec FROM herd_eval_specs WHERE hash = %(hash)s;

-- name: join_lock
-- Items stored and a job's end meet under the lock of the job's bucket (of 64): an item
-- stored after its job's end takes the answer it left (job_answers), and a job's end
-- after the items were stored finds them. Buckets in order: no two submissions wait on
-- each other in a cycle. Two-key locks: apart from the one-key locks of liveness.
SELECT pg_advisory_xact_lock(hashtext('herd.eval.join'), b)
  FROM (SELECT DISTINCT mod(j, 64)::int AS b FROM unnest(%(jobs)s::bigint[]) AS j
         ORDER BY 1) AS x;

-- name: put_items
-- doc and spec: what the job will read, kept from retention while this is queued. An
-- item whose job ended already (deduplicated onto it as it finished) is done at once.
INSERT INTO herd_eval_items (batch, path, key, job_id, doc, spec, status, source, result,
                             finished_at)
SELECT %(batch)s, p, k, j, d, %(spec)s, CASE WHEN a.result IS NULL THEN 'queued' ELSE 'done' END,
       a.source, a.result, CASE WHEN a.result IS NOT NULL THEN now() END
  FROM unnest(%(paths)s::text[], %(keys)s::text[], %(jobs)s::bigint[], %(docs)s::text[])
       AS x(p, k, j, d)
  LEFT JOIN herd_eval_job_answers a ON a.job_id = x.j AND a.key = x.k
ON CONFLICT DO NOTHING;

-- name: put_batch_specs
INSERT INTO herd_eval_batch_specs (batch, spec) VALUES (%(batch)s, %(spec)s)
ON CONFLICT DO NOTHING;

-- name: put_batch
-- A later submit to the same batch leaves its budget and limits unless given; one by
-- another owner changes nothing and returns no row (the caller refuses it).
INSERT INTO herd_eval_batches AS b (batch, budget, limits, owner)
VALUES (%(b)s, %(budget)s, coalesce(%(limits)s, '{}'::jsonb), %(owner)s)
ON CONFLICT (batch) DO UPDATE SET
   budget = CASE WHEN %(set)s THEN excluded.budget ELSE b.budget END,
   limits = coalesce(%(limits)s, b.limits), updated_at = now()
 WHERE coalesce(b.owner, 'local') = %(owner)s
RETURNING parked;

-- name: batch_owner
-- A batch made before batches had owners is the local owner's.
SELECT coalesce(owner, 'local') FROM herd_eval_batches WHERE batch = %(b)s;

-- name: batch
SELECT budget, spent, reserved, parked, limits, parked_reason, created_at
  FROM herd_eval_batches WHERE batch = %(b)s;

-- name: batch_exists
SELECT EXISTS (SELECT 1 FROM herd_eval_batches WHERE batch = %(b)s)
    OR EXISTS (SELECT 1 FROM herd_eval_items WHERE batch = %(b)s);

-- name: legacy_batch
-- A batch submitted before batches had rows.
INSERT INTO herd_eval_batches (batch) VALUES (%(b)s) ON CONFLICT (batch) DO NOTHING;

-- name: park
-- Parked for its budget, or refused by the provider; never over a cancellation.
UPDATE herd_eval_batches
   SET parked = %(why)s, parked_reason = %(reason)s,
       parked_at = coalesce(parked_at, now()), updated_at = now()
 WHERE batch = %(b)s AND parked IS DISTINCT FROM 'cancelled';

-- name: park_items
UPDATE herd_eval_items SET status = 'parked'
 WHERE batch = %(b)s AND status = 'queued' RETURNING job_id;

-- name: unpark
UPDATE herd_eval_batches SET parked = NULL, parked_at = NULL, parked_reason = NULL,
       updated_at = now()
 WHERE batch = %(b)s AND parked = ANY(%(why)s) RETURNING batch;

-- name: unpark_items
UPDATE herd_eval_items SET status = 'queued'
 WHERE batch = %(b)s AND status = 'parked' RETURNING job_id;

-- name: set_budget
UPDATE herd_eval_batches SET budget = %(budget)s, updated_at = now()
 WHERE batch = %(b)s RETURNING spent, reserved, parked;

-- name: cancel_batch
UPDATE herd_eval_batches SET parked = 'cancelled', parked_at = now(), parked_reason = NULL,
       updated_at = now()
 WHERE batch = %(b)s RETURNING batch;

-- name: cancel_items
UPDATE herd_eval_items SET status = 'cancelled', finished_at = now()
 WHERE batch = %(b)s AND status IN ('queued', 'parked') RETURNING job_id;

-- name: cancel_job_items
UPDATE herd_eval_items SET status = 'cancelled', finished_at = now()
 WHERE job_id = %(job)s AND status IN ('queued', 'parked');

-- name: open_provider_batches
SELECT handle, spec, provider_batch_id, key_variable FROM herd_eval_provider_batches
 WHERE batch = %(b)s AND state <> 'done' ORDER BY handle;

-- name: items_cancelled
SELECT coalesce(sum(n), 0) FROM herd_eval_item_counts
 WHERE batch = %(b)s AND status = 'cancelled';

-- name: job_done
-- Every item a job serves: documents deduplicated onto it share its result. Only the
-- items of its own key: a job id reused after its store lost data serves another key.
UPDATE herd_eval_items SET status = 'done', source = %(source)s, result = %(result)s,
       finished_at = now()
 WHERE job_id = %(job)s AND key = %(key)s AND status <> 'done';

-- name: job_answer
-- For the items stored after this end (job_done's lock held): kept an hour (purge).
INSERT INTO herd_eval_job_answers (job_id, key, source, result)
VALUES (%(job)s, %(key)s, %(source)s, %(result)s)
ON CONFLICT (job_id, key) DO UPDATE SET source = excluded.source, result = excluded.result,
       at = now();

-- name: job_join_lock
SELECT pg_advisory_xact_lock(hashtext('herd.eval.join'), mod(%(job)s::bigint, 64)::int);

-- name: waiting_jobs
-- Parked items too: a job running when its batch parked is still running.
SELECT DISTINCT job_id FROM herd_eval_items
 WHERE status IN ('queued', 'parked') AND (%(b)s::text IS NULL OR batch = %(b)s);

-- name: settle_job
-- A job's result lands on the items of the key it answered, the same check as job_done.
UPDATE herd_eval_items SET status = 'done', source = %(source)s, result = %(result)s,
       finished_at = now()
 WHERE job_id = %(job)s AND key = %(key)s AND status IN ('queued', 'parked');

-- name: item_counts
-- By status, from the counters (3016): a few rows per batch, whatever its size.
SELECT status, staged, sum(n) FROM herd_eval_item_counts
 WHERE %(b)s::text IS NULL OR batch = %(b)s
 GROUP BY status, staged HAVING sum(n) <> 0;

-- name: batch_specs
-- The (provider, model) of each batch given, by the specs its items were sent with.
SELECT DISTINCT bs.batch, s.spec->>'provider', s.spec->>'model'
  FROM herd_eval_batch_specs bs JOIN herd_eval_specs s ON s.hash = bs.spec
 WHERE bs.batch = ANY(%(batches)s::text[]);

-- name: list_batches
-- Newest first, a page at a time: (created_at, batch) of the last row seen.
SELECT b.batch, b.created_at, b.budget, b.spent, b.parked, b.parked_reason
  FROM herd_eval_batches b
 WHERE %(before)s::timestamptz IS NULL OR (b.created_at, b.batch) < (%(before)s, %(after)s)
 ORDER BY b.created_at DESC, b.batch DESC LIMIT %(limit)s;

-- name: batch_counts
SELECT batch, sum(n), coalesce(sum(n) FILTER (WHERE status = 'done'), 0),
       coalesce(sum(n) FILTER (WHERE status = 'parked'), 0),
       coalesce(sum(n) FILTER (WHERE status = 'cancelled'), 0)
  FROM herd_eval_item_counts WHERE batch = ANY(%(batches)s) GROUP BY batch;

-- name: results
-- One row per document, answered or not, with what its answer cost.
SELECT i.path, i.status, i.source, i.result, i.job_id, i.key, i.finished_at,
       s.spec->>'model', s.spec->>'provider'
  FROM herd_eval_items i LEFT JOIN herd_eval_specs s ON s.hash = i.spec
 WHERE i.batch = %(b)s AND (%(after)s::text IS NULL OR i.path > %(after)s)
 ORDER BY i.path LIMIT %(limit)s;

-- name: key_calls
-- What the calls of these keys made for this batch cost: tokens, cost and time.
SELECT key, sum(input_tokens), sum(cached_input_tokens), sum(output_tokens),
       sum(cost), bool_or(cost IS NULL), min(at), max(at), count(*)
  FROM herd_eval_ledger
 WHERE batch = %(b)s AND key = ANY(%(keys)s) AND state = 'closed'
   AND kind IN ('call', 'lost', 'failed', 'cut_short')
 GROUP BY key;

-- name: in_flight
SELECT DISTINCT ON (key) key, job_id FROM herd_eval_items
 WHERE spec = %(spec)s AND key = ANY(%(keys)s) AND status IN ('queued', 'parked')
 ORDER BY key, job_id DESC;

-- name: chunk_requests
SELECT DISTINCT ON (i.key) i.key, d.text FROM herd_eval_items i
  JOIN herd_eval_documents d ON d.hash = i.doc
 WHERE i.batch = %(b)s AND i.spec = %(spec)s AND i.key = ANY(%(keys)s);

-- name: parked_state
SELECT parked FROM herd_eval_batches WHERE batch = %(b)s;

-- name: record_handle
-- The handle starts with its time in milliseconds (12 hex) by the store's clock, not the
-- worker's: a worker whose clock runs fast must not make a takeover miss its batch.
-- With a key pool (the variables in %(pool)s, the file's order), the chunk's batch is made
-- with the key that has the fewest provider batches still open, so that a batch's
-- chunks spread over the keys (each has its own queue of batch tokens at the provider);
-- the caller holds pick_batch_key's lock, so that submitters side by side count each
-- other's choices. NULL without a pool: the provider's own variable.
INSERT INTO herd_eval_provider_batches (handle, chunk, batch, spec, provider, key_variable)
VALUES (lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
        || %(random)s, %(chunk)s, %(b)s, %(spec)s, %(provider)s,
        (SELECT p.v FROM unnest(%(pool)s::text[]) WITH ORDINALITY AS p(v, ord)
          ORDER BY (SELECT count(*) FROM herd_eval_provider_batches o
                     WHERE o.key_variable = p.v AND o.state <> 'done'), p.ord
          LIMIT 1))
ON CONFLICT (chunk) DO NOTHING;

-- name: pick_batch_key
-- Held to the end of the transaction that records a handle with a pool: one pick at a
-- time, each seeing the batches the others recorded (a handle is recorded once a chunk).
SELECT pg_advisory_xact_lock(hashtext('herd_eval_provider_batches.key_variable'));

-- name: handle_of_chunk
SELECT handle, file_id, provider_batch_id, key_variable FROM herd_eval_provider_batches
 WHERE chunk = %(chunk)s;

-- name: drop_chunk
UPDATE herd_eval_provider_batches SET state = 'done', status = 'cancelled', updated_at = now()
 WHERE handle = %(handle)s;

-- name: polling
UPDATE herd_eval_provider_batches
   SET file_id = %(file)s, provider_batch_id = %(batch_id)s, state = 'polling',
       updated_at = now()
 WHERE handle = %(handle)s;

-- name: move_items
-- The items waiting on one job wait on another now (a poll job, a retry job).
UPDATE herd_eval_items SET job_id = %(to)s WHERE job_id = %(job)s AND status = 'queued';

-- name: provider_batch
SELECT batch, spec, provider_batch_id, state, polls, key_variable FROM herd_eval_provider_batches
 WHERE handle = %(handle)s;

-- name: polled
UPDATE herd_eval_provider_batches SET polls = polls + 1, status = %(status)s,
       updated_at = now()
 WHERE handle = %(handle)s;

-- name: still_waiting_keys
SELECT DISTINCT key FROM herd_eval_items
 WHERE job_id = ANY(%(jobs)s) AND key = ANY(%(keys)s) AND status IN ('queued', 'parked');

-- name: key_done_by_batch
-- By job, not batch: a later submission's items joined these keys. An answer that came
-- back from a batch cancelled mid-run was paid for: delivered.
UPDATE herd_eval_items SET status = 'done', source = 'batch',
       result = %(result)s || jsonb_build_object('path', path), finished_at = now()
 WHERE job_id = ANY(%(jobs)s) AND key = %(key)s AND status <> 'done';

-- name: move_key
UPDATE herd_eval_items SET job_id = %(to)s
 WHERE job_id = ANY(%(jobs)s) AND key = %(key)s AND status IN ('queued', 'parked');

-- name: provider_batch_done
UPDATE herd_eval_provider_batches SET state = 'done', status = %(status)s, updated_at = now()
 WHERE handle = %(handle)s;

-- name: retry_documents
SELECT DISTINCT ON (key) key, path, doc FROM herd_eval_items
 WHERE batch = %(b)s AND spec = %(spec)s AND key = ANY(%(keys)s);

-- name: late_items
SELECT DISTINCT ON (key) key, batch, path, doc, spec FROM herd_eval_items
 WHERE job_id = %(job)s AND status IN ('queued', 'parked');

-- name: move_job_key
UPDATE herd_eval_items SET job_id = %(to)s
 WHERE job_id = %(job)s AND key = %(key)s AND status IN ('queued', 'parked');

-- name: job_key_done_by_batch
UPDATE herd_eval_items SET status = 'done', source = 'batch',
       result = %(result)s || jsonb_build_object('path', path), finished_at = now()
 WHERE job_id = %(job)s AND key = %(key)s AND status <> 'done';

-- The cost ledger (herd.llm.eval.ledger): a row per call made or avoided, and its
-- summaries kept in the same statement (the functions of herd/llm/sql/3022).

-- name: ledger_record
SELECT herd_ledger_record(%(batch)s, %(job)s, %(key)s, %(kind)s, %(model)s, %(provider)s, %(i)s,
                          %(o)s, %(cost)s, %(ci)s, %(cw)s, %(ps)s, %(kid)s);

-- name: ledger_close
SELECT herd_ledger_close(%(id)s, %(kind)s, %(i)s, %(o)s, %(cost)s, %(ci)s, %(cw)s, %(ps)s);

-- name: ledger_reserve
UPDATE herd_eval_batches SET reserved = reserved + %(w)s, updated_at = now()
 WHERE batch = %(b)s AND parked IS NULL
   AND (budget IS NULL OR spent + reserved + %(w)s <= budget)
RETURNING budget;


-- name: ledger_open
INSERT INTO herd_eval_ledger (batch, job_id, key, kind, model, provider, input_tokens, state,
                              reserved, key_id)
VALUES (%(batch)s, %(job)s, %(key)s, 'call', %(model)s, %(provider)s, %(i)s, 'open', %(w)s,
        %(kid)s)
RETURNING id;

-- name: batch_keys
SELECT key_id, n, cost FROM herd_eval_batch_keys WHERE batch = %(b)s ORDER BY key_id;

-- name: ledger_open_of_job
SELECT id FROM herd_eval_ledger WHERE job_id = %(job)s AND state = 'open' ORDER BY id;

-- name: ledger_open_before
SELECT id FROM herd_eval_ledger
 WHERE state = 'open' AND at < now() - make_interval(secs => %(keep)s)
 ORDER BY at LIMIT %(limit)s;

-- name: ledger_totals
SELECT kind, n, input_tokens, output_tokens, cost, saved, cached_input_tokens,
       cache_write_tokens, provider_saved, unpriced FROM herd_eval_ledger_totals;

-- name: ledger_batch_totals
-- (A batch's unpriced calls are counted by model from its rows: batch_model_costs.)
SELECT kind, n, input_tokens, output_tokens, cost, NULL::float8, cached_input_tokens,
       cache_write_tokens, provider_saved FROM herd_eval_batch_totals
 WHERE batch = %(b)s;

-- name: purge_ledger
DELETE FROM herd_eval_ledger WHERE id IN (
    SELECT id FROM herd_eval_ledger WHERE at < now() - make_interval(secs => %(keep)s)
       AND state = 'closed'
     ORDER BY at LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_keys
DELETE FROM herd_eval_keys WHERE key IN (
    SELECT key FROM herd_eval_keys WHERE last_at < now() - make_interval(secs => %(keep)s)
     ORDER BY last_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_items
DELETE FROM herd_eval_items WHERE (batch, path) IN (
    SELECT batch, path FROM herd_eval_items
     WHERE status IN ('done', 'cancelled')
       AND finished_at < now() - make_interval(secs => %(keep)s)
     ORDER BY finished_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_failures
-- Records of items no longer waiting (answered, cancelled, purged).
DELETE FROM herd_eval_failures WHERE (batch, path) IN (
    SELECT batch, path FROM herd_eval_failures f
     WHERE NOT EXISTS (SELECT 1 FROM herd_eval_items i
                        WHERE i.batch = f.batch AND i.path = f.path
                          AND i.status IN ('queued', 'parked'))
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_job_answers
DELETE FROM herd_eval_job_answers WHERE (job_id, key) IN (
    SELECT job_id, key FROM herd_eval_job_answers
     WHERE at < now() - make_interval(secs => %(keep)s)
     ORDER BY at LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_batch_specs
DELETE FROM herd_eval_batch_specs WHERE (batch, spec) IN (
    SELECT batch, spec FROM herd_eval_batch_specs s
     WHERE NOT EXISTS (SELECT 1 FROM herd_eval_items i WHERE i.batch = s.batch)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_batches b WHERE b.batch = s.batch)
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_batch_totals
DELETE FROM herd_eval_batch_totals WHERE (batch, kind) IN (
    SELECT batch, kind FROM herd_eval_batch_totals b
     WHERE updated_at < now() - make_interval(secs => %(keep)s)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_items i WHERE i.batch = b.batch)
     ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_batch_keys
DELETE FROM herd_eval_batch_keys WHERE (batch, key_id) IN (
    SELECT batch, key_id FROM herd_eval_batch_keys b
     WHERE updated_at < now() - make_interval(secs => %(keep)s)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_items i WHERE i.batch = b.batch)
     ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: legacy_queued
SELECT EXISTS (SELECT 1 FROM herd_eval_items
                WHERE status IN ('queued', 'parked') AND (doc IS NULL OR spec IS NULL));

-- name: purge_documents
DELETE FROM herd_eval_documents WHERE hash IN (
    SELECT hash FROM herd_eval_documents d
     WHERE created_at < now() - make_interval(secs => %(keep)s)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_items i
                        WHERE i.status IN ('queued', 'parked') AND i.doc = d.hash)
       -- a pipeline's piece still to answer reads its input from here
       AND NOT EXISTS (SELECT 1 FROM herd_eval_pieces p
                        WHERE p.status = 'queued' AND p.doc = d.hash)
     ORDER BY created_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_specs
DELETE FROM herd_eval_specs WHERE hash IN (
    SELECT hash FROM herd_eval_specs s
     WHERE created_at < now() - make_interval(secs => %(keep)s)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_items i
                        WHERE i.status IN ('queued', 'parked') AND i.spec = s.hash)
     ORDER BY created_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_provider_batches
DELETE FROM herd_eval_provider_batches WHERE handle IN (
    SELECT handle FROM herd_eval_provider_batches
     WHERE state = 'done' AND updated_at < now() - make_interval(secs => %(keep)s)
     ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: purge_batches
DELETE FROM herd_eval_batches WHERE batch IN (
    SELECT batch FROM herd_eval_batches b
     WHERE updated_at < now() - make_interval(secs => %(keep)s)
       AND NOT EXISTS (SELECT 1 FROM herd_eval_items i WHERE i.batch = b.batch)
     ORDER BY updated_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED);

-- name: items_on_jobs
-- The batch's items (all batches: NULL) waiting on these jobs: the running ones.
SELECT path, job_id, key, status FROM herd_eval_items
 WHERE job_id = ANY(%(jobs)s) AND status IN ('queued', 'parked') AND pipeline IS NULL
   AND (%(b)s::text IS NULL OR batch = %(b)s);

-- name: running_by_batch
-- Per batch of those given, its items (not in stages) waiting on one of the leased jobs
-- given: the list's running count, along herd_eval_items_open_job.
SELECT batch, count(*) FROM herd_eval_items
 WHERE job_id = ANY(%(jobs)s::bigint[]) AND status IN ('queued', 'parked')
   AND pipeline IS NULL AND batch = ANY(%(batches)s::text[])
 GROUP BY batch;

-- name: failed_by_batch
-- Per batch of those given, its documents that will not be answered: items still waiting
-- whose job died or is gone (herd_eval_failures), and a pipeline's failed documents.
SELECT batch, count(*) FROM (
    SELECT f.batch FROM herd_eval_failures f
     WHERE f.batch = ANY(%(batches)s::text[]) AND f.job_id <> ALL(%(running)s::bigint[])
       AND EXISTS (SELECT 1 FROM herd_eval_items i
                    WHERE i.batch = f.batch AND i.path = f.path AND i.job_id = f.job_id
                      AND i.status IN ('queued', 'parked'))
    UNION ALL
    SELECT batch FROM herd_eval_items
     WHERE batch = ANY(%(batches)s::text[]) AND status = 'failed'
) failed GROUP BY batch;

-- name: failure_counts
-- Waiting items whose job died or is gone, while they still wait on that job; those on
-- a running job (requeued from the dead letters) are running. From the failures, each
-- item looked up by its key (LIMIT 1: never a join that walks the batch's items).
SELECT f.kind, count(*), count(*) FILTER (WHERE i.status = 'parked')
  FROM herd_eval_failures f
 CROSS JOIN LATERAL (SELECT status FROM herd_eval_items i
                      WHERE i.batch = f.batch AND i.path = f.path AND i.job_id = f.job_id
                        AND i.status IN ('queued', 'parked') LIMIT 1) i
 WHERE (%(b)s::text IS NULL OR f.batch = %(b)s) AND f.job_id <> ALL(%(running)s)
 GROUP BY f.kind;

-- name: failures_shown
SELECT f.batch, f.path, f.job_id, f.kind, i.key
  FROM herd_eval_failures f
 CROSS JOIN LATERAL (SELECT key FROM herd_eval_items i
                      WHERE i.batch = f.batch AND i.path = f.path AND i.job_id = f.job_id
                        AND i.status IN ('queued', 'parked') LIMIT 1) i
 WHERE (%(b)s::text IS NULL OR f.batch = %(b)s) AND f.job_id <> ALL(%(running)s)
 ORDER BY f.batch, f.path LIMIT %(limit)s;

-- name: unswept
-- Waiting items not known to have failed, not on a running job, first by path: the
-- sweep's (herd.llm.eval.status), at most limit. A pipeline's documents wait on their
-- pieces' jobs (herd.llm.eval.stages), not one job.
SELECT i.path, i.job_id, i.key, i.batch FROM herd_eval_items i
 WHERE (%(b)s::text IS NULL OR i.batch = %(b)s) AND i.status IN ('queued', 'parked')
   AND i.pipeline IS NULL AND i.job_id <> ALL(%(running)s)
   AND NOT EXISTS (SELECT 1 FROM herd_eval_failures f
                    WHERE f.batch = i.batch AND f.path = i.path AND f.job_id = i.job_id)
 ORDER BY i.batch, i.path LIMIT %(limit)s;

-- name: record_failures
-- Items found waiting on a dead or gone job: (batch, path, job, kind) each.
INSERT INTO herd_eval_failures AS f (batch, path, job_id, kind)
SELECT * FROM unnest(%(batches)s::text[], %(paths)s::text[], %(jobs)s::bigint[],
                     %(kinds)s::text[])
ON CONFLICT (batch, path) DO UPDATE SET job_id = excluded.job_id, kind = excluded.kind,
       at = now();

-- name: job_failed
-- The job's task failed for good (its last attempt, or Fatal): its waiting items of its
-- key are dead, unless its dead-lettering is refused and it runs again (job_running).
INSERT INTO herd_eval_failures (batch, path, job_id, kind)
SELECT batch, path, job_id, 'dead' FROM herd_eval_items
 WHERE job_id = %(job)s AND key = %(key)s AND status IN ('queued', 'parked')
ON CONFLICT (batch, path) DO UPDATE SET job_id = excluded.job_id, kind = 'dead', at = now();

-- name: job_running
-- A job that runs is not dead (requeued from the dead letters, or its death refused).
DELETE FROM herd_eval_failures WHERE job_id = %(job)s;

-- name: forget_failure
DELETE FROM herd_eval_failures WHERE batch = %(b)s AND path = %(path)s AND job_id = %(job)s;

-- name: recent_rate
-- Documents answered in the last minute, and the first answer's time: the rate and ETA.
-- Along herd_eval_items_done_at: the last minute's answers and the two ends.
SELECT (SELECT count(*) FROM herd_eval_items
         WHERE batch = %(b)s AND status = 'done'
           AND finished_at > now() - interval '60 seconds'),
       extract(epoch FROM now() - (SELECT min(finished_at) FROM herd_eval_items
                                    WHERE batch = %(b)s AND status = 'done')),
       extract(epoch FROM now() - (SELECT max(finished_at) FROM herd_eval_items
                                    WHERE batch = %(b)s AND status = 'done'));

-- name: batch_schema
SELECT s.spec->'schema' FROM herd_eval_specs s
 WHERE s.hash IN (SELECT DISTINCT spec FROM herd_eval_items WHERE batch = %(b)s) LIMIT 1;

-- name: dashboard_batches
-- The dashboard's batches: the newest, and older ones still parked on their budget or a
-- refusal; updated_at moves on a submission, a park and every call's spend. The batch
-- rows only (herd_eval_batches_created), never their items.
SELECT batch, updated_at FROM (
    (SELECT batch, created_at, updated_at FROM herd_eval_batches
      ORDER BY created_at DESC, batch DESC LIMIT %(limit)s)
    UNION
    (SELECT batch, created_at, updated_at FROM herd_eval_batches
      WHERE parked IN ('budget', 'refused') ORDER BY created_at DESC LIMIT %(limit)s)
) b ORDER BY created_at DESC, batch DESC;

-- name: batch_model_costs
-- A batch's closed paid calls by model, from the ledger's rows (herd_eval_ledger_batch):
-- whole only while none of them was purged (HERD_LEDGER_TTL); n against the summary's.
-- estimated: the cost of calls cut off mid-call (cut short, lost, failed), at their worst case.
SELECT model, count(*), sum(input_tokens), sum(output_tokens), sum(cost),
       count(*) FILTER (WHERE cost IS NULL),
       sum(cost) FILTER (WHERE kind IN ('cut_short', 'lost', 'failed'))
  FROM herd_eval_ledger
 WHERE batch = %(b)s AND kind IN ('call', 'lost', 'failed', 'cut_short') AND state = 'closed'
 GROUP BY model ORDER BY model;

-- name: put_fallbacks
UPDATE herd_eval_batches SET fallbacks = %(fallbacks)s WHERE batch = %(b)s;

-- name: batch_fallbacks
SELECT fallbacks FROM herd_eval_batches WHERE batch = %(b)s;
