-- The semantic query cache (herd.semantic). Needs pgvector; applied on first use.
CREATE EXTENSION IF NOT EXISTS vector;

-- One row per cached query. The vector column has no fixed dimension so that
-- caches of several embedders share the table; each dimension gets a partial
-- HNSW index on (vec::vector(dim)) when a cache of that dimension opens.
-- Times are epoch seconds of the server's clock; 1e18 means "never expires".
CREATE TABLE herd_semantic (
    cache      text NOT NULL,              -- the cache's name: the eviction bound is per name
    id         text NOT NULL,              -- hash of the scope and the normalized query
    tenant     text NOT NULL,              -- scope values, hashed (base.Scope.tags)
    embedder   text NOT NULL,
    collection text NOT NULL,
    generation text NOT NULL,
    scope      jsonb NOT NULL,             -- the same, readable
    dim        integer NOT NULL,
    query      text NOT NULL,
    guard      jsonb NOT NULL,             -- the near-miss guard signature
    value      jsonb NOT NULL,
    vec        vector NOT NULL,
    delta      double precision NOT NULL,  -- seconds the computation took (XFetch)
    created_at double precision NOT NULL,
    expires_at double precision NOT NULL,
    keep_until double precision NOT NULL,  -- expiry plus the stale-while-revalidate window
    last_used  double precision NOT NULL,
    PRIMARY KEY (cache, id)
);
CREATE INDEX herd_semantic_lru ON herd_semantic (cache, last_used);
CREATE INDEX herd_semantic_keep ON herd_semantic (keep_until);

CREATE TABLE herd_semantic_stats (
    cache text NOT NULL,
    name  text NOT NULL,
    value bigint NOT NULL,
    PRIMARY KEY (cache, name)
);

-- How many rows each cache holds, kept by the upsert so that enforcing the bound
-- never counts the table.
CREATE TABLE herd_semantic_sizes (
    cache text PRIMARY KEY,
    n     bigint NOT NULL
);
