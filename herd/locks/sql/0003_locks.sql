-- Fenced locks (herd.locks). A row per lock name, kept for good: release only
-- moves expires_at into the past, so the next holder's token is the last one
-- plus one, and a stale holder's token never comes back.
CREATE TABLE herd_locks (
    name       text        PRIMARY KEY,
    token      bigint      NOT NULL CHECK (token > 0),
    owner      text,                    -- the last holder, for people reading the table
    expires_at timestamptz NOT NULL     -- held while expires_at > now(), by server time
);
