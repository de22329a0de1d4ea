-- Fair shares of a limit (herd.limits.base.Share): the flows (batches) of a scope, each
-- {w: weight, u: use over the window in fractions of the limit, decayed with the time
-- constant p_window since flows_at, s: last seen, x: waiting until (epoch seconds)}.
ALTER TABLE herd_limits
    ADD COLUMN flows    jsonb  NOT NULL DEFAULT '{}',
    ADD COLUMN flows_at float8;

DROP FUNCTION herd_limit_acquire(text, jsonb, bigint, text, float8, float8, float8, float8,
                                 float8, integer);

-- One acquire, all or nothing (5001), and with a flow its fair share: refused ('share')
-- while another flow of the scope is waiting and would be further below its weighted
-- share than this one with this call. A refusal is kept too (the flow is waiting), so
-- a refused call writes its flow's row; without a flow nothing changes from 5001. A
-- flow granted stays waiting p_linger at most; one refused, until told plus p_grace.
CREATE FUNCTION herd_limit_acquire(
    p_scope text, p_lim jsonb, p_tokens bigint, p_holder text, p_hold float8,
    p_req_burst float8, p_req_rate float8, p_tok_burst float8, p_tok_rate float8,
    p_max_concurrent integer,
    p_flow text, p_weight float8, p_cost float8, p_window float8, p_grace float8,
    p_linger float8, p_tick float8, p_forget float8,
    OUT granted boolean, OUT wait float8, OUT at float8, OUT reason text
) LANGUAGE plpgsql AS $$
DECLARE
    r herd_limits%ROWTYPE;
    live jsonb;
    held integer;
    w float8;
    fl jsonb;
    decay float8;
    mine_u float8;
    mine_x float8;
BEGIN
    SELECT * INTO r FROM herd_limits WHERE scope = p_scope FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO herd_limits (scope) VALUES (p_scope) ON CONFLICT (scope) DO NOTHING;
        SELECT * INTO r FROM herd_limits WHERE scope = p_scope FOR UPDATE;
    END IF;
    at := extract(epoch FROM clock_timestamp());
    granted := true;
    wait := 0;
    IF r.paused_until > at THEN
        granted := false;
        wait := r.paused_until - at;
        reason := 'paused';
    END IF;
    IF p_max_concurrent IS NOT NULL THEN
        SELECT coalesce(jsonb_object_agg(key, value), '{}'), count(*) INTO live, held
          FROM jsonb_each(r.slots) WHERE (value #>> '{}')::float8 > at AND key <> p_holder;
        IF held >= p_max_concurrent THEN
            SELECT min((value #>> '{}')::float8) - at INTO w FROM jsonb_each(live);
            IF reason IS DISTINCT FROM 'paused' AND w > wait THEN
                reason := 'concurrency';
            END IF;
            wait := greatest(wait, w);
            granted := false;
        END IF;
    END IF;
    IF p_req_rate IS NOT NULL THEN
        w := r.req_tat + (1 - p_req_burst) / p_req_rate - at;
        IF w > 0 THEN
            IF reason IS DISTINCT FROM 'paused' AND w > wait THEN
                reason := 'requests';
            END IF;
            wait := greatest(wait, w);
            granted := false;
        END IF;
    END IF;
    IF p_tok_rate IS NOT NULL AND p_tokens > 0 THEN
        w := r.tok_tat + (p_tokens - p_tok_burst) / p_tok_rate - at;
        IF w > 0 THEN
            IF reason IS DISTINCT FROM 'paused' AND w > wait THEN
                reason := 'tokens';
            END IF;
            wait := greatest(wait, w);
            granted := false;
        END IF;
    END IF;
    IF p_flow IS NOT NULL THEN
        decay := exp(-greatest(0, at - coalesce(r.flows_at, at)) / p_window);
        SELECT coalesce(jsonb_object_agg(key, jsonb_build_object(
                   'w', (value ->> 'w')::float8, 'u', (value ->> 'u')::float8 * decay,
                   's', (value ->> 's')::float8, 'x', (value ->> 'x')::float8)), '{}')
          INTO fl FROM jsonb_each(r.flows)
         WHERE key = p_flow OR at - (value ->> 's')::float8 <= p_forget;
        mine_u := coalesce((fl -> p_flow ->> 'u')::float8, 0);
        mine_x := coalesce((fl -> p_flow ->> 'x')::float8, 0);
        IF granted AND EXISTS (
            SELECT 1 FROM jsonb_each(fl)
             WHERE key <> p_flow AND (value ->> 'x')::float8 >= at
               AND ((value ->> 'u')::float8 + p_cost) / (value ->> 'w')::float8
                   < (mine_u + p_cost) / p_weight) THEN
            granted := false;
            wait := p_tick;
            reason := 'share';
        END IF;
        IF granted THEN
            mine_u := mine_u + p_cost;
            mine_x := least(mine_x, at + p_linger);
        ELSE
            mine_x := greatest(mine_x, at + wait + p_grace);
        END IF;
        fl := fl || jsonb_build_object(p_flow, jsonb_build_object(
                  'w', p_weight, 'u', mine_u, 's', at, 'x', mine_x));
        UPDATE herd_limits SET flows = fl, flows_at = at, used_at = now()
         WHERE scope = p_scope;
    END IF;
    IF NOT granted THEN
        RETURN;
    END IF;
    UPDATE herd_limits SET
        lim = p_lim,
        req_tat = CASE WHEN p_req_rate IS NULL THEN req_tat
                       ELSE greatest(req_tat, at) + 1 / p_req_rate END,
        tok_tat = CASE WHEN p_tok_rate IS NULL THEN tok_tat
                       ELSE greatest(tok_tat, at) + p_tokens / p_tok_rate END,
        slots = CASE WHEN p_max_concurrent IS NULL THEN slots
                     ELSE live || jsonb_build_object(p_holder, at + p_hold) END,
        requests = requests + 1,
        tokens = tokens + p_tokens,
        used_at = now()
     WHERE scope = p_scope;
END
$$;
