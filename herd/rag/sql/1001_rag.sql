-- Corpus indexing (herd.rag). Needs pgvector; applied on first use of herd.rag only.
CREATE EXTENSION IF NOT EXISTS vector;

-- A collection's source chunks: the latest text of every canonical unit. Workers
-- read texts from here; queue payloads carry only chunk ids and hashes.
CREATE TABLE herd_chunks (
    collection text NOT NULL,
    chunk_id   text NOT NULL,
    source     text NOT NULL,          -- the file it came from (deletion scope)
    part       text NOT NULL,          -- the partition: a book, a law (re-index locks)
    text       text NOT NULL,
    breadcrumb text NOT NULL,
    metadata   jsonb NOT NULL,
    hash       text NOT NULL,
    PRIMARY KEY (collection, chunk_id)
);
CREATE INDEX herd_chunks_source ON herd_chunks (collection, source);

-- Index generations. A generation's vectors live in a table of their own
-- (herd_vectors_<id>, vector(dim), HNSW), built beside the live one when the
-- fingerprint changes and swapped in by one UPDATE of herd_collections.
CREATE TABLE herd_generations (
    id          integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    collection  text NOT NULL,
    fingerprint text NOT NULL,         -- embedder id + chunker settings
    settings    jsonb NOT NULL,
    dim         integer NOT NULL,
    status      text NOT NULL DEFAULT 'building' CHECK (status IN ('building', 'live', 'retired')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    swapped_at  timestamptz
);

CREATE TABLE herd_collections (
    name            text PRIMARY KEY,
    live_generation integer REFERENCES herd_generations (id),
    created_at      timestamptz NOT NULL DEFAULT now()
);

-- Ingest runs: what a run saw decides what it deletes (only inside its own scope:
-- the files it read and the folders it was given), once their replacements exist.
CREATE TABLE herd_ingest_runs (
    id          integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    collection  text NOT NULL,
    generation  integer NOT NULL REFERENCES herd_generations (id),
    files       text[] NOT NULL,
    folders     text[] NOT NULL,
    status      text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'done')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
ALTER TABLE herd_chunks ADD COLUMN run_id integer NOT NULL;
