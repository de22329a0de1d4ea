-- A batch's fallbacks (provider:model, in order), where its calls are not one job each
-- with them in its payload: a pipeline's stage calls read them from here.
ALTER TABLE herd_eval_batches ADD COLUMN fallbacks jsonb NOT NULL DEFAULT '[]'::jsonb;
