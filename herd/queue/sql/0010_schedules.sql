-- Periodic jobs (herd.schedule): one row per schedule. A tick is fired by advancing
-- last_tick with a compare-and-set in the transaction that enqueues its job, so
-- however many workers tick, each tick makes one job (no leader, no session state:
-- PgBouncer-safe).
CREATE TABLE herd_schedules (
    name        text        PRIMARY KEY,
    task        text        NOT NULL,
    queue       text        NOT NULL,
    cron        text,
    every       float8,
    timezone    text        NOT NULL,
    policy      text        NOT NULL,
    catch_up    integer     NOT NULL,
    priority    integer     NOT NULL DEFAULT 0,
    paused      boolean     NOT NULL DEFAULT false,
    last_tick   timestamptz,          -- the newest tick fired (or dropped by a resume)
    last_job_id bigint,               -- the job of the last run (a tick's or run-now's)
    last_run_at timestamptz,
    runs        bigint      NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
