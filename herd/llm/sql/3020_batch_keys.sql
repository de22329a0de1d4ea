-- Per batch and key id: the calls each key of a pool paid and their cost, what `herd
-- eval status` shows beside the ledger's kinds (a summary, as herd_eval_batch_totals:
-- read paths never scan the ledger). Purged with them.
CREATE TABLE herd_eval_batch_keys (
    batch      text    NOT NULL,
    key_id     text    NOT NULL,
    n          bigint  NOT NULL DEFAULT 0,
    cost       numeric,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (batch, key_id)
);
CREATE INDEX herd_eval_batch_keys_age ON herd_eval_batch_keys (updated_at);
