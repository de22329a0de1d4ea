-- The variable of the pool key a chunk's provider batch is made with (herd.limits.config,
-- a key pool), recorded with its handle before anything is uploaded: the provider keeps a
-- batch under the key (account) that made it, so its polls, its cancel and a worker that
-- takes the chunk over must use that key. The variable's name, never the key. NULL: the
-- provider's own variable (no pool), as every row written before pools reached the Batch
-- API.
ALTER TABLE herd_eval_provider_batches ADD COLUMN key_variable text;

-- A provider batch's billed lines name the key that paid, as a synchronous call's row
-- does (3019, 3020): herd_ledger_record takes the key's id (NULL: a call avoided, or no
-- pool). A call with the old arguments still resolves here, to p_kid's default.
DROP FUNCTION herd_ledger_record(text, bigint, text, text, text, text, bigint, bigint, numeric,
                                 bigint, bigint, numeric);
CREATE FUNCTION herd_ledger_record(
    p_batch text, p_job bigint, p_key text, p_kind text, p_model text, p_provider text,
    p_i bigint, p_o bigint, p_cost numeric, p_ci bigint, p_cw bigint, p_ps numeric,
    p_kid text DEFAULT NULL
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM herd_ledger_count(p_kind, p_key, p_job, p_batch, p_kid, p_i, p_o, p_cost, p_ci,
                              p_cw, p_ps);
    INSERT INTO herd_eval_ledger (batch, job_id, key, kind, model, provider, input_tokens,
                                  output_tokens, cost, cached_input_tokens,
                                  cache_write_tokens, provider_saved, key_id)
    VALUES (p_batch, p_job, p_key, p_kind, p_model, p_provider, p_i, p_o, p_cost, p_ci, p_cw,
            p_ps, p_kid);
END $$;
