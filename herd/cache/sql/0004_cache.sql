-- The exact result cache (herd.cache). expires_at NULL: kept until cleared.
-- delta: seconds the value took to compute, for XFetch early refresh.
CREATE TABLE herd_cache (
    namespace  text        NOT NULL,
    key        text        NOT NULL,
    value      jsonb       NOT NULL,
    delta      float8      NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    PRIMARY KEY (namespace, key)
);
CREATE INDEX herd_cache_expiry ON herd_cache (expires_at) WHERE expires_at IS NOT NULL;

-- Counters per namespace (hits, misses, computed, waited, stale, early refreshes, errors).
CREATE TABLE herd_cache_stats (
    namespace text   NOT NULL,
    name      text   NOT NULL,
    value     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (namespace, name)
);
