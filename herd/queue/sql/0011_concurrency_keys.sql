-- Concurrency keys: a job may carry a key (a tenant, a user) and its queue then runs at
-- most max_running of that key's jobs at once, fleet-wide, handing turns round the
-- keys (least recently served first) so that one key's backlog starves no other.
--
-- herd_key_counts holds one row per (queue, key) with work: how many of its jobs run
-- (processing) and wait (pending, delayed included), kept exact by the statement
-- triggers below in the transaction of every change of herd_jobs. The claim locks a
-- key's row (SKIP LOCKED) before it takes that key's jobs, and the trigger raises the
-- count under that lock: a second claimer skips the row, or, once the first committed,
-- re-reads the count it raised (PostgreSQL re-checks a locked row's latest version).
-- A slot is given back by whatever moves the job out of processing (completion,
-- failure, release, a dead-lettered stall): the count follows the job's status, so a
-- stale holder, whose write changes nothing, gives nothing back.
--
-- Every change is an ordered upsert, as 0007's counters are. Lock order (after 0007's): job rows, then key rows in (queue, key) order, then the
-- counters of 0007. The claim takes key rows before job rows, but SKIP LOCKED: it
-- never waits there. Its triggers only touch key rows it has locked itself. The key
-- triggers are named herd_jobs_by_key_* so that they fire before herd_jobs_count_*
-- (triggers fire in name order): key rows are always taken before counters.
ALTER TABLE herd_jobs ADD COLUMN concurrency_key text, ADD COLUMN key_limit integer;

-- Ready jobs of each key, for the claim's walk over a key's jobs.
CREATE INDEX herd_jobs_ready_key ON herd_jobs (queue, concurrency_key, priority DESC, id)
    WHERE status = 'pending' AND concurrency_key IS NOT NULL;

CREATE TABLE herd_key_counts (
    queue       text        NOT NULL,
    key         text        NOT NULL,
    running     integer     NOT NULL DEFAULT 0,
    waiting     integer     NOT NULL DEFAULT 0,
    max_running integer     NOT NULL,         -- the latest enqueued job's limit
    served_at   timestamptz NOT NULL DEFAULT '-infinity',  -- its last turn in a claim
    PRIMARY KEY (queue, key)
);
-- Keys with waiting jobs, the least recently served first: the claim's turn order.
CREATE INDEX herd_key_counts_turn ON herd_key_counts (queue, served_at, key) WHERE waiting > 0;

CREATE FUNCTION herd_jobs_by_key_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_jobs WHERE concurrency_key IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    INSERT INTO herd_key_counts AS k (queue, key, running, waiting, max_running)
    SELECT queue, concurrency_key, count(*) FILTER (WHERE status = 'processing'),
           count(*) FILTER (WHERE status = 'pending'),
           (array_agg(key_limit ORDER BY id DESC))[1]
      FROM new_jobs WHERE concurrency_key IS NOT NULL
     GROUP BY queue, concurrency_key ORDER BY queue, concurrency_key
    ON CONFLICT (queue, key) DO UPDATE SET running = k.running + excluded.running,
           waiting = k.waiting + excluded.waiting, max_running = excluded.max_running;
    RETURN NULL;
END $$;

CREATE FUNCTION herd_jobs_by_key_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_jobs WHERE concurrency_key IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    -- A job's queue and key never change; only its status moves it between counts.
    WITH moved AS (
        SELECT n.queue, n.concurrency_key AS key,
               (n.status = 'processing')::int - (o.status = 'processing')::int AS run,
               (n.status = 'pending')::int - (o.status = 'pending')::int AS wait
          FROM old_jobs o JOIN new_jobs n USING (id)
         WHERE n.concurrency_key IS NOT NULL AND o.status <> n.status
    ), delta AS (
        SELECT queue, key, sum(run) AS run, sum(wait) AS wait FROM moved
         GROUP BY queue, key HAVING sum(run) <> 0 OR sum(wait) <> 0
    )
    -- A key whose job was claimed goes to the back of the claims' turn order.
    INSERT INTO herd_key_counts AS k (queue, key, running, waiting, max_running)
    SELECT queue, key, run, wait, 1 FROM delta ORDER BY queue, key
    ON CONFLICT (queue, key) DO UPDATE SET running = k.running + excluded.running,
           waiting = k.waiting + excluded.waiting,
           served_at = CASE WHEN excluded.running > 0 THEN clock_timestamp()
                            ELSE k.served_at END;
    RETURN NULL;
END $$;

CREATE FUNCTION herd_jobs_by_key_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM old_jobs WHERE concurrency_key IS NOT NULL
                      AND status IN ('pending', 'processing')) THEN
        RETURN NULL;
    END IF;
    INSERT INTO herd_key_counts AS k (queue, key, running, waiting, max_running)
    SELECT queue, concurrency_key, -count(*) FILTER (WHERE status = 'processing'),
           -count(*) FILTER (WHERE status = 'pending'), 1
      FROM old_jobs WHERE concurrency_key IS NOT NULL
     GROUP BY queue, concurrency_key ORDER BY queue, concurrency_key
    ON CONFLICT (queue, key) DO UPDATE SET running = k.running + excluded.running,
           waiting = k.waiting + excluded.waiting;
    RETURN NULL;
END $$;

CREATE FUNCTION herd_jobs_by_key_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM herd_key_counts;
    RETURN NULL;
END $$;

CREATE TRIGGER herd_jobs_by_key_insert AFTER INSERT ON herd_jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION herd_jobs_by_key_insert();
CREATE TRIGGER herd_jobs_by_key_update AFTER UPDATE ON herd_jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION herd_jobs_by_key_update();
CREATE TRIGGER herd_jobs_by_key_delete AFTER DELETE ON herd_jobs
    REFERENCING OLD TABLE AS old_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION herd_jobs_by_key_delete();
CREATE TRIGGER herd_jobs_by_key_truncate AFTER TRUNCATE ON herd_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION herd_jobs_by_key_truncate();
