-- `herd eval cancel BATCH`: a batch can be parked for good ('cancelled'); its waiting
-- items become 'cancelled' (an item answered before, or by a provider batch that had
-- already run it, stays or becomes 'done': that answer was paid for).
-- A chunk cancelled before it reached the provider is 'done' with status 'cancelled'.
ALTER TABLE herd_eval_batches DROP CONSTRAINT herd_eval_batches_parked_check;
ALTER TABLE herd_eval_batches ADD CONSTRAINT herd_eval_batches_parked_check
    CHECK (parked IN ('budget', 'cancelled'));
ALTER TABLE herd_eval_items DROP CONSTRAINT herd_eval_items_status_check;
ALTER TABLE herd_eval_items ADD CONSTRAINT herd_eval_items_status_check
    CHECK (status IN ('queued', 'parked', 'done', 'cancelled'));
-- Cancelled items age out with the done ones (HERD_EVAL_TTL from finished_at).
DROP INDEX herd_eval_items_finished;
CREATE INDEX herd_eval_items_finished ON herd_eval_items (finished_at)
    WHERE status IN ('done', 'cancelled');
-- The items a job serves, and the job serving a key: lookups, not scans of the history
-- (a job's end updates its items; a Batch API submission joins keys already in flight).
CREATE INDEX herd_eval_items_open_job ON herd_eval_items (job_id) WHERE status <> 'done';
CREATE INDEX herd_eval_items_open_key ON herd_eval_items (spec, key) WHERE status <> 'done';
