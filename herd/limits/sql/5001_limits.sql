-- Fleet-wide provider limits (herd.limits). A row per scope (provider:model:key id);
-- times are epoch seconds of the server's clock. See herd/limits/base.py for the GCRA.
CREATE TABLE herd_limits (
    scope        text        PRIMARY KEY,
    lim          jsonb       NOT NULL DEFAULT '{}',   -- the limit last acquired under
    req_tat      float8      NOT NULL DEFAULT '-infinity',
    tok_tat      float8      NOT NULL DEFAULT '-infinity',
    slots        jsonb       NOT NULL DEFAULT '{}',   -- holder -> expiry; at most max_concurrent live
    paused_until float8,
    requests     bigint      NOT NULL DEFAULT 0,
    tokens       bigint      NOT NULL DEFAULT 0,
    waits        bigint      NOT NULL DEFAULT 0,
    wait_seconds float8      NOT NULL DEFAULT 0,
    rate_limited bigint      NOT NULL DEFAULT 0,
    used_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX herd_limits_used_at ON herd_limits (used_at);

-- One acquire, all or nothing. A function, not a bare statement, because the clock
-- must be read after the row lock: a statement's now() is taken before it waits for
-- the lock, so a grant could be dated before the grant it waited for.
CREATE FUNCTION herd_limit_acquire(
    p_scope text, p_lim jsonb, p_tokens bigint, p_holder text, p_hold float8,
    p_req_burst float8, p_req_rate float8, p_tok_burst float8, p_tok_rate float8,
    p_max_concurrent integer,
    OUT granted boolean, OUT wait float8, OUT at float8, OUT reason text
) LANGUAGE plpgsql AS $$
DECLARE
    r herd_limits%ROWTYPE;
    live jsonb;
    held integer;
    w float8;
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
