-- Batches with a budget and limits, and a ledger whose calls are opened before the
-- request leaves and closed after (herd.llm.ledger), so a call cut short by a kill is
-- still counted: the ledger's calls equal the provider's bill.

-- One row per batch, written on submit. limits: {"rpm", "tpm", "max_concurrent"} (the
-- fleet limiter reads them); budget NULL: none. spent: the closed calls' cost;
-- reserved: the worst case of the calls open now. parked: why the batch's jobs wait
-- ('budget'), NULL while they run. Purged with the batch's items (HERD_EVAL_TTL).
CREATE TABLE herd_eval_batches (
    batch      text PRIMARY KEY,
    limits     jsonb  NOT NULL DEFAULT '{}',
    budget     float8 CHECK (budget >= 0),
    spent      float8 NOT NULL DEFAULT 0,
    reserved   float8 NOT NULL DEFAULT 0,
    parked     text   CHECK (parked IN ('budget')),
    parked_at  timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX herd_eval_batches_age ON herd_eval_batches (updated_at);

-- state: open (the request may be on its way; no usage yet) or closed. Rows written
-- before this migration were closed when written. reserved: the worst-case cost held
-- against the batch's budget while the call is open.
-- Kinds added: failed (the provider answered an error or timed out after the request
-- left), cut_short (open when its worker died; closed by the worker that took over).
ALTER TABLE herd_eval_ledger
    ADD COLUMN state text NOT NULL DEFAULT 'closed' CHECK (state IN ('open', 'closed')),
    ADD COLUMN reserved float8;
ALTER TABLE herd_eval_ledger DROP CONSTRAINT herd_eval_ledger_kind_check;
ALTER TABLE herd_eval_ledger ADD CONSTRAINT herd_eval_ledger_kind_check
    CHECK (kind IN ('call', 'lost', 'failed', 'cut_short', 'cache', 'singleflight', 'dedup'));
-- "Which calls of this job are open?" at each job's start: a lookup, not a scan.
CREATE INDEX herd_eval_ledger_open ON herd_eval_ledger (job_id) WHERE state = 'open';
CREATE INDEX herd_eval_ledger_open_at ON herd_eval_ledger (at) WHERE state = 'open';

-- parked: the item's job waits for the batch's budget to be raised.
ALTER TABLE herd_eval_items DROP CONSTRAINT herd_eval_items_status_check;
ALTER TABLE herd_eval_items ADD CONSTRAINT herd_eval_items_status_check
    CHECK (status IN ('queued', 'parked', 'done'));
CREATE INDEX herd_eval_items_waiting_doc ON herd_eval_items (doc)
    WHERE status IN ('queued', 'parked');
CREATE INDEX herd_eval_items_waiting_spec ON herd_eval_items (spec)
    WHERE status IN ('queued', 'parked');
CREATE INDEX herd_eval_items_parked ON herd_eval_items (batch) WHERE status = 'parked';
