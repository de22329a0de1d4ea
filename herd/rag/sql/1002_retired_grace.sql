-- A retired generation keeps its vectors for a grace period (HERD_RAG_RETIRED_GRACE),
-- so that a query that resolved it just before a swap still finds its table; a
-- later finalize drops the table and stamps dropped_at.
ALTER TABLE herd_generations ADD COLUMN retired_at timestamptz;
ALTER TABLE herd_generations ADD COLUMN dropped_at timestamptz;
