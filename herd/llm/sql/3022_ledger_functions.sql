-- A ledger row and its summaries written by one statement (herd.llm.eval.ledger): closing
-- a paid call sent eleven (BEGIN, its row locked, the key's row, whether the job called
-- before, the key's estimate, the batch's and the pool key's totals, the kinds' totals,
-- the row closed, the batch's spend, COMMIT) and an avoided call seven, a third of a
-- piece's statements. The same steps, in the same order (the key's row, then the
-- batch's, then the totals in kind order: concurrent writers queue, never deadlock), run
-- in the server.
--
-- Money saved (herd.llm.eval.ledger's docstring): an avoided call is worth its key's
-- cost over the jobs that paid it; a call that changes that estimate revalues what the
-- key has saved by avoided × (new − old).

CREATE FUNCTION herd_ledger_count(
    p_kind text, p_key text, p_job bigint, p_batch text, p_kid text, p_i bigint,
    p_o bigint, p_cost numeric, p_ci bigint, p_cw bigint, p_ps numeric
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    k herd_eval_keys%ROWTYPE;
    v_before numeric;
    v_after numeric;
    v_cost numeric;
    v_jobs bigint;
    v_kinds text[] := ARRAY[p_kind];
    v_n bigint[] := ARRAY[1];
    v_saved numeric[] := ARRAY[NULL::numeric];
    avoided_kind text;
    avoided_n bigint;
BEGIN
    IF p_kind IN ('call', 'cache', 'singleflight', 'dedup') THEN
        INSERT INTO herd_eval_keys (key) VALUES (p_key)
        ON CONFLICT (key) DO UPDATE SET last_at = now()
        RETURNING * INTO k;  -- locks the key's row until commit
        v_before := CASE WHEN k.cost IS NOT NULL AND k.jobs > 0 THEN k.cost / k.jobs END;
        IF p_kind = 'call' THEN
            v_jobs := k.jobs + (NOT EXISTS (
                SELECT 1 FROM herd_eval_ledger
                 WHERE key = p_key AND kind = 'call' AND state = 'closed'
                   AND coalesce(job_id, 0) = coalesce(p_job, 0)))::int;
            v_cost := CASE WHEN p_cost IS NULL THEN k.cost ELSE coalesce(k.cost, 0) + p_cost END;
            v_after := CASE WHEN v_cost IS NOT NULL AND v_jobs > 0 THEN v_cost / v_jobs END;
            IF v_after IS NOT NULL AND v_after IS DISTINCT FROM v_before THEN
                FOREACH avoided_kind IN ARRAY ARRAY['cache', 'singleflight', 'dedup'] LOOP
                    avoided_n := CASE avoided_kind WHEN 'cache' THEN k.cache
                                 WHEN 'singleflight' THEN k.singleflight ELSE k.dedup END;
                    IF avoided_n > 0 THEN
                        v_kinds := v_kinds || avoided_kind;
                        v_n := v_n || 0::bigint;
                        v_saved := v_saved || avoided_n * (v_after - coalesce(v_before, 0));
                    END IF;
                END LOOP;
            END IF;
            UPDATE herd_eval_keys SET cost = v_cost, jobs = v_jobs WHERE key = p_key;
        ELSE
            v_saved[1] := v_before;
            UPDATE herd_eval_keys
               SET cache = cache + (p_kind = 'cache')::int,
                   singleflight = singleflight + (p_kind = 'singleflight')::int,
                   dedup = dedup + (p_kind = 'dedup')::int
             WHERE key = p_key;
        END IF;
    END IF;
    IF p_batch IS NOT NULL THEN
        INSERT INTO herd_eval_batch_totals AS t (batch, kind, n, input_tokens, output_tokens,
                                                 cost, cached_input_tokens,
                                                 cache_write_tokens, provider_saved)
        VALUES (p_batch, p_kind, 1, p_i, p_o, p_cost, p_ci, p_cw, p_ps)
        ON CONFLICT (batch, kind) DO UPDATE
           SET n = t.n + 1, input_tokens = t.input_tokens + excluded.input_tokens,
               output_tokens = t.output_tokens + excluded.output_tokens,
               cost = CASE WHEN excluded.cost IS NULL THEN t.cost
                           ELSE coalesce(t.cost, 0) + excluded.cost END,
               cached_input_tokens = t.cached_input_tokens + excluded.cached_input_tokens,
               cache_write_tokens = t.cache_write_tokens + excluded.cache_write_tokens,
               provider_saved = CASE WHEN excluded.provider_saved IS NULL THEN t.provider_saved
                                     ELSE coalesce(t.provider_saved, 0)
                                          + excluded.provider_saved END,
               updated_at = now();
        -- Which key of a pool paid (its id).
        IF p_kind IN ('call', 'lost', 'failed', 'cut_short') AND coalesce(p_kid, '') <> '' THEN
            INSERT INTO herd_eval_batch_keys AS t (batch, key_id, n, cost)
            VALUES (p_batch, p_kid, 1, p_cost)
            ON CONFLICT (batch, key_id) DO UPDATE
               SET n = t.n + 1,
                   cost = CASE WHEN excluded.cost IS NULL THEN t.cost
                               ELSE coalesce(t.cost, 0) + excluded.cost END,
                   updated_at = now();
        END IF;
    END IF;
    -- The row's own kind first, then the revalued avoided kinds in their order: the
    -- fixed order in which every writer takes these rows.
    INSERT INTO herd_eval_ledger_totals AS t (kind, n, input_tokens, output_tokens, cost,
                                              saved, cached_input_tokens,
                                              cache_write_tokens, provider_saved)
    SELECT u.kind, u.n,
           CASE WHEN u.ord = 1 THEN p_i ELSE 0 END, CASE WHEN u.ord = 1 THEN p_o ELSE 0 END,
           CASE WHEN u.ord = 1 THEN p_cost END, u.saved,
           CASE WHEN u.ord = 1 THEN p_ci ELSE 0 END, CASE WHEN u.ord = 1 THEN p_cw ELSE 0 END,
           CASE WHEN u.ord = 1 THEN p_ps END
      FROM unnest(v_kinds, v_n, v_saved) WITH ORDINALITY AS u (kind, n, saved, ord)
     ORDER BY u.ord
    ON CONFLICT (kind) DO UPDATE
       SET n = t.n + excluded.n, input_tokens = t.input_tokens + excluded.input_tokens,
           output_tokens = t.output_tokens + excluded.output_tokens,
           cost = CASE WHEN excluded.cost IS NULL THEN t.cost
                       ELSE coalesce(t.cost, 0) + excluded.cost END,
           saved = CASE WHEN excluded.saved IS NULL THEN t.saved
                        ELSE coalesce(t.saved, 0) + excluded.saved END,
           cached_input_tokens = t.cached_input_tokens + excluded.cached_input_tokens,
           cache_write_tokens = t.cache_write_tokens + excluded.cache_write_tokens,
           provider_saved = CASE WHEN excluded.provider_saved IS NULL THEN t.provider_saved
                                 ELSE coalesce(t.provider_saved, 0)
                                      + excluded.provider_saved END;
END $$;

-- A row written closed (a call avoided, or a provider batch's billed line).
CREATE FUNCTION herd_ledger_record(
    p_batch text, p_job bigint, p_key text, p_kind text, p_model text, p_provider text,
    p_i bigint, p_o bigint, p_cost numeric, p_ci bigint, p_cw bigint, p_ps numeric
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM herd_ledger_count(p_kind, p_key, p_job, p_batch, NULL, p_i, p_o, p_cost, p_ci,
                              p_cw, p_ps);
    INSERT INTO herd_eval_ledger (batch, job_id, key, kind, model, provider, input_tokens,
                                  output_tokens, cost, cached_input_tokens,
                                  cache_write_tokens, provider_saved)
    VALUES (p_batch, p_job, p_key, p_kind, p_model, p_provider, p_i, p_o, p_cost, p_ci, p_cw,
            p_ps);
END $$;

-- An open call closed as p_kind with its usage (p_i NULL: the estimate it was opened
-- with), counted, and its reservation released into its batch's spent. p_kind NULL: the
-- request never left, the row goes and nothing is counted. A call whose usage never came
-- back (cut_short, lost, failed) costs its reservation, the worst case it may have been
-- billed. False: the row was closed already (another worker took it over).
CREATE FUNCTION herd_ledger_close(
    p_id bigint, p_kind text, p_i bigint, p_o bigint, p_cost numeric, p_ci bigint,
    p_cw bigint, p_ps numeric
) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    r herd_eval_ledger%ROWTYPE;
    v_cost numeric := p_cost;
    tokens bigint;
BEGIN
    SELECT * INTO r FROM herd_eval_ledger WHERE id = p_id AND state = 'open' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF p_kind IS NULL THEN
        DELETE FROM herd_eval_ledger WHERE id = p_id;
    ELSE
        IF p_kind IN ('cut_short', 'lost', 'failed') AND r.reserved IS NOT NULL THEN
            v_cost := r.reserved;
        END IF;
        tokens := coalesce(p_i, r.input_tokens);
        PERFORM herd_ledger_count(p_kind, r.key, r.job_id, r.batch, r.key_id, tokens, p_o,
                                  v_cost, p_ci, p_cw, p_ps);
        UPDATE herd_eval_ledger SET state = 'closed', kind = p_kind, input_tokens = tokens,
               output_tokens = p_o, cost = v_cost, cached_input_tokens = p_ci,
               cache_write_tokens = p_cw, provider_saved = p_ps
         WHERE id = p_id;
    END IF;
    IF r.batch IS NOT NULL THEN
        UPDATE herd_eval_batches
           SET spent = spent + coalesce(CASE WHEN p_kind IS NOT NULL THEN v_cost END, 0),
               reserved = greatest(0, reserved - coalesce(r.reserved, 0)), updated_at = now()
         WHERE batch = r.batch;
    END IF;
    RETURN true;
END $$;
