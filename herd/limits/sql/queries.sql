-- Every statement of the PostgreSQL limiter, one block per verb. Times are seconds
-- since the epoch by the server's clock: extract(epoch FROM clock_timestamp()).

-- name: acquire
SELECT granted, wait, at, reason FROM herd_limit_acquire(
    %(scope)s, %(lim)s, %(tokens)s, %(holder)s, %(hold)s,
    %(req_burst)s, %(req_rate)s, %(tok_burst)s, %(tok_rate)s, %(max_concurrent)s,
    %(flow)s, %(weight)s, %(cost)s, %(window)s, %(grace)s, %(linger)s, %(tick)s, %(forget)s);

-- name: renew
UPDATE herd_limits
   SET slots = jsonb_set(slots, ARRAY[%(holder)s], to_jsonb(extract(epoch FROM clock_timestamp())::float8 + %(hold)s))
 WHERE scope = %(scope)s AND (slots ->> %(holder)s)::float8 > extract(epoch FROM clock_timestamp())::float8
RETURNING 1;

-- name: release
UPDATE herd_limits SET slots = slots - %(holder)s WHERE scope = %(scope)s AND slots ? %(holder)s;

-- name: adjust
-- A charge moves tat on from max(tat, now); a refund moves it back, never to before
-- now (an idle bucket's credit is not for a refund to grow).
UPDATE herd_limits SET
    tokens = tokens + %(tokens)s,
    tok_tat = CASE
        WHEN %(rate)s::float8 IS NULL THEN tok_tat
        WHEN %(tokens)s >= 0
            THEN greatest(tok_tat, extract(epoch FROM clock_timestamp())::float8) + %(tokens)s / %(rate)s::float8
        WHEN tok_tat > extract(epoch FROM clock_timestamp())::float8
            THEN greatest(tok_tat + %(tokens)s / %(rate)s::float8, extract(epoch FROM clock_timestamp())::float8)
        ELSE tok_tat END,
    used_at = now()
 WHERE scope = %(scope)s;

-- name: pause
INSERT INTO herd_limits AS l (scope, paused_until, rate_limited)
VALUES (%(scope)s, extract(epoch FROM clock_timestamp())::float8 + %(seconds)s, %(n)s)
ON CONFLICT (scope) DO UPDATE SET
    paused_until = greatest(coalesce(l.paused_until, 0), excluded.paused_until),
    rate_limited = l.rate_limited + excluded.rate_limited,
    used_at = now();

-- name: note_wait
INSERT INTO herd_limits AS l (scope, waits, wait_seconds) VALUES (%(scope)s, 1, %(seconds)s)
ON CONFLICT (scope) DO UPDATE SET
    waits = l.waits + 1, wait_seconds = l.wait_seconds + excluded.wait_seconds, used_at = now();

-- name: stats
SELECT scope, lim, req_tat, tok_tat, paused_until, requests, tokens, waits, wait_seconds,
       rate_limited, now_s,
       (SELECT count(*) FROM jsonb_each(slots) WHERE (value #>> '{}')::float8 > now_s),
       flows, flows_at
  FROM herd_limits, (SELECT extract(epoch FROM clock_timestamp())::float8 AS now_s) AS c
 ORDER BY scope;

-- name: stats_of
SELECT scope, lim, req_tat, tok_tat, paused_until, requests, tokens, waits, wait_seconds,
       rate_limited, now_s,
       (SELECT count(*) FROM jsonb_each(slots) WHERE (value #>> '{}')::float8 > now_s),
       flows, flows_at
  FROM herd_limits, (SELECT extract(epoch FROM clock_timestamp())::float8 AS now_s) AS c
 WHERE scope = ANY(%(scopes)s) ORDER BY scope;

-- name: purge
DELETE FROM herd_limits WHERE scope IN (
    SELECT scope FROM herd_limits
     WHERE used_at < now() - %(ttl)s::float8 * interval '1 second'
     ORDER BY used_at LIMIT %(batch)s);
