-- The provider's own prompt cache, apart from herd's: of a call's input tokens (all the
-- provider counted), cached_input_tokens were read from the provider's cache and
-- cache_write_tokens written to it; provider_saved is what the call would have cost
-- with every input token at the full input price, minus what it cost (negative while
-- writes are not paid back by reads). NULL provider_saved: the model is not priced.
-- Purged with the rows and summaries that carry them (HERD_LEDGER_TTL, HERD_EVAL_TTL).
ALTER TABLE herd_eval_ledger
    ADD COLUMN cached_input_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN cache_write_tokens  bigint NOT NULL DEFAULT 0,
    ADD COLUMN provider_saved      float8;
ALTER TABLE herd_eval_ledger_totals
    ADD COLUMN cached_input_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN cache_write_tokens  bigint NOT NULL DEFAULT 0,
    ADD COLUMN provider_saved      float8;
ALTER TABLE herd_eval_batch_totals
    ADD COLUMN cached_input_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN cache_write_tokens  bigint NOT NULL DEFAULT 0,
    ADD COLUMN provider_saved      float8;
