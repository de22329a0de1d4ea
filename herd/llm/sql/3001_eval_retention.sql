-- Retention of evaluation state, and a ledger summary that outlives the ledger's rows
-- (herd.llm.evaluate.EvalStore): read paths count kinds and batches, never rows.

-- Per kind, over all time: what /overview, /metrics and `herd status` read.
-- saved: the money the avoided calls (cache, singleflight, dedup) would have cost,
-- each at its key's cost per computing job (herd_eval_keys), revalued when a later
-- call changes that cost.
CREATE TABLE herd_eval_ledger_totals (
    kind          text PRIMARY KEY,
    n             bigint NOT NULL DEFAULT 0,
    input_tokens  bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cost          float8,            -- NULL: no priced row yet
    saved         float8             -- NULL: no avoided row of a priced key yet
);

-- Per batch and kind: what `herd eval status --batch` and GET /evals/{batch} read.
-- Kept while the batch has items, then HERD_EVAL_TTL after its last row.
CREATE TABLE herd_eval_batch_totals (
    batch         text   NOT NULL,
    kind          text   NOT NULL,
    n             bigint NOT NULL DEFAULT 0,
    input_tokens  bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cost          float8,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (batch, kind)
);
CREATE INDEX herd_eval_batch_totals_age ON herd_eval_batch_totals (updated_at);

-- Per canonical key: what its calls cost and how many jobs made them (the estimate of
-- one computation), and how many calls of each avoided kind it saved. A compaction of
-- the key's ledger rows, so the estimate survives their purge; kept HERD_LEDGER_TTL
-- after the key's last row.
CREATE TABLE herd_eval_keys (
    key          text PRIMARY KEY,
    cost         float8,             -- sum of its calls' costs; NULL: none priced
    jobs         bigint NOT NULL DEFAULT 0,
    cache        bigint NOT NULL DEFAULT 0,
    singleflight bigint NOT NULL DEFAULT 0,
    dedup        bigint NOT NULL DEFAULT 0,
    last_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX herd_eval_keys_age ON herd_eval_keys (last_at);

-- Purges walk these oldest first, a bounded batch at a time.
CREATE INDEX herd_eval_ledger_at ON herd_eval_ledger (at);
-- "Has this job already called for this key?" (a repair is a second call of one job).
CREATE INDEX herd_eval_ledger_key_job ON herd_eval_ledger (key, job_id) WHERE kind = 'call';
CREATE INDEX herd_eval_items_finished ON herd_eval_items (finished_at) WHERE status = 'done';
CREATE INDEX herd_eval_documents_age ON herd_eval_documents (created_at);
CREATE INDEX herd_eval_specs_age ON herd_eval_specs (created_at);

-- Which document and spec a queued item's job will read, so that neither is purged
-- from under it. NULL on items stored before this migration: while one of those is
-- queued, documents and specs are not purged at all.
ALTER TABLE herd_eval_items ADD COLUMN doc text, ADD COLUMN spec text;
CREATE INDEX herd_eval_items_queued_doc ON herd_eval_items (doc) WHERE status = 'queued';
CREATE INDEX herd_eval_items_queued_spec ON herd_eval_items (spec) WHERE status = 'queued';

-- The summary of the rows already there (once, at migration).
INSERT INTO herd_eval_keys (key, cost, jobs, cache, singleflight, dedup, last_at)
SELECT key,
       sum(cost) FILTER (WHERE kind = 'call'),
       count(DISTINCT coalesce(job_id, 0)) FILTER (WHERE kind = 'call'),
       count(*) FILTER (WHERE kind = 'cache'),
       count(*) FILTER (WHERE kind = 'singleflight'),
       count(*) FILTER (WHERE kind = 'dedup'),
       max(at)
  FROM herd_eval_ledger GROUP BY key;

INSERT INTO herd_eval_ledger_totals (kind, n, input_tokens, output_tokens, cost, saved)
SELECT l.kind, count(*), sum(l.input_tokens), sum(l.output_tokens), sum(l.cost),
       sum(k.cost / nullif(k.jobs, 0)) FILTER (WHERE l.kind IN ('cache', 'singleflight', 'dedup'))
  FROM herd_eval_ledger l JOIN herd_eval_keys k ON k.key = l.key
 GROUP BY l.kind;

INSERT INTO herd_eval_batch_totals (batch, kind, n, input_tokens, output_tokens, cost, updated_at)
SELECT batch, kind, count(*), sum(input_tokens), sum(output_tokens), sum(cost), max(at)
  FROM herd_eval_ledger WHERE batch IS NOT NULL GROUP BY batch, kind;
