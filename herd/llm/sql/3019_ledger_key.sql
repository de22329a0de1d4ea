-- Which key of a pool paid for a call (herd.limits.config, a key pool): its id, a hash
-- prefix of the key (herd.limits.key_id), never the key. NULL: a row of a call avoided,
-- or written before keys were recorded.
ALTER TABLE herd_eval_ledger ADD COLUMN key_id text;
