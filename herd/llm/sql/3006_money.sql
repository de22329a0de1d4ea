-- Money kept exactly: sums of float8 left residues (0.7659124999999998) in budgets and
-- totals. numeric adds exactly; a float8 cost converts to the shortest decimal that
-- reads back as the same float.
ALTER TABLE herd_eval_batches
    ALTER COLUMN budget TYPE numeric, ALTER COLUMN spent TYPE numeric,
    ALTER COLUMN reserved TYPE numeric;
ALTER TABLE herd_eval_ledger
    ALTER COLUMN cost TYPE numeric, ALTER COLUMN reserved TYPE numeric,
    ALTER COLUMN provider_saved TYPE numeric;
ALTER TABLE herd_eval_ledger_totals
    ALTER COLUMN cost TYPE numeric, ALTER COLUMN saved TYPE numeric,
    ALTER COLUMN provider_saved TYPE numeric;
ALTER TABLE herd_eval_batch_totals
    ALTER COLUMN cost TYPE numeric, ALTER COLUMN provider_saved TYPE numeric;
ALTER TABLE herd_eval_keys ALTER COLUMN cost TYPE numeric;
-- Why a batch stopped: budget, cancelled, or refused (the provider refused its key or
-- model), with the provider's words.
ALTER TABLE herd_eval_batches DROP CONSTRAINT IF EXISTS herd_eval_batches_parked_check;
ALTER TABLE herd_eval_batches ADD CONSTRAINT herd_eval_batches_parked_check
    CHECK (parked IN ('budget', 'cancelled', 'refused'));
ALTER TABLE herd_eval_batches ADD COLUMN parked_reason text;
CREATE INDEX herd_eval_batches_created ON herd_eval_batches (created_at DESC, batch);
