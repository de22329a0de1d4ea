-- Every statement of the PostgreSQL locks, one block per verb, by the server's clock.

-- name: acquire
INSERT INTO herd_locks AS l (name, token, owner, expires_at)
VALUES (%(name)s, 1, %(owner)s, now() + %(ttl)s::float8 * interval '1 second')
ON CONFLICT (name) DO UPDATE
   SET token = l.token + 1, owner = excluded.owner, expires_at = excluded.expires_at
 WHERE l.expires_at <= now() OR (%(take_over)s AND l.owner = excluded.owner)
RETURNING token;

-- name: renew
UPDATE herd_locks SET expires_at = now() + %(ttl)s::float8 * interval '1 second'
 WHERE name = %(name)s AND token = %(token)s AND expires_at > now()
RETURNING token;

-- name: release
-- NOTIFY is delivered at commit, i.e. once the row really is free.
WITH released AS (
    UPDATE herd_locks SET expires_at = '-infinity'
     WHERE name = %(name)s AND token = %(token)s AND expires_at > now()
    RETURNING name
)
SELECT pg_notify(%(channel)s, name) FROM released;

-- name: check
SELECT 1 FROM herd_locks WHERE name = %(name)s AND token = %(token)s AND expires_at > now();

-- name: assert_held
-- clock_timestamp(), not now(): inside a caller's transaction now() is the time
-- the transaction began, and the lease may have expired since.
-- FOR SHARE, not FOR KEY SHARE: a takeover only updates non-key columns, which
-- FOR KEY SHARE would let through.
SELECT 1 FROM herd_locks
 WHERE name = %(name)s AND token = %(token)s AND expires_at > clock_timestamp()
   FOR SHARE;
