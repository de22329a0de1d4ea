-- The job table. One row per job for its whole life: recovery after a crash
-- reads the row itself (an expired lease), so no worker registry is needed.
CREATE TABLE herd_jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text        NOT NULL,
    task             text        NOT NULL,
    payload          jsonb       NOT NULL,
    status           text        NOT NULL DEFAULT 'pending'
                     CHECK (status IN ('pending', 'processing', 'succeeded', 'dead')),
    priority         integer     NOT NULL DEFAULT 0,
    dedup_key        text,
    attempts         integer     NOT NULL DEFAULT 0,  -- errors raised by the task
    stalls           integer     NOT NULL DEFAULT 0,  -- leases that expired
    max_attempts     integer     NOT NULL CHECK (max_attempts >= 1),
    max_stalls       integer     NOT NULL CHECK (max_stalls >= 1),
    lease_seconds    float8      NOT NULL CHECK (lease_seconds > 0),
    -- Fencing token: incremented by every claim, never reset. Every write
    -- after a claim names it and is refused once it is stale.
    lease_token      bigint      NOT NULL DEFAULT 0,
    lease_owner      text,
    lease_expires_at timestamptz,
    run_at           timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    result           jsonb,
    last_error       text,
    last_traceback   text,
    dead_reason      text,
    last_worker      text
);

-- Claims: ready jobs by priority then age.
CREATE INDEX herd_jobs_ready ON herd_jobs (queue, priority DESC, id) WHERE status = 'pending';
-- Takeover of jobs whose worker died or froze.
CREATE INDEX herd_jobs_leased ON herd_jobs (queue, lease_expires_at) WHERE status = 'processing';
-- A dedup key is unique among active jobs only: once a job finishes, the key is free.
CREATE UNIQUE INDEX herd_jobs_dedup ON herd_jobs (dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('pending', 'processing');
CREATE INDEX herd_jobs_dead ON herd_jobs (finished_at) WHERE status = 'dead';
