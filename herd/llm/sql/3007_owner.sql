-- Who made a batch: 'token:<sha256 of the bearer token, 32 hex>' for an API caller with a
-- token, 'local' for the CLI, Python callers and an API without tokens (loopback only).
-- Only its owner or an admin changes the batch (budget, limits, resume, cancel); a batch
-- made before owners (NULL) is the local owner's.
ALTER TABLE herd_eval_batches ADD COLUMN IF NOT EXISTS owner text;
