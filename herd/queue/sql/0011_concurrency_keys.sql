-- Concurrency keys: a job may carry a key (a tenant, a user) and its queue then runs at
-- most max_running of that key's jobs at once, fleet-wide, handing turns round the
-- keys (least recently served first) so that one key's backlog starves no other.
--
-- herd_key_counts holds one row per (queue, key) with work: how many of its jobs were
-- ever claimed and how many wait (pending, delayed included); herd_key_released how
-- many left processing, split into slots by the writing backend's pid (as 0007's
-- counters). Running = claimed - released. Both are kept exact by the statement
-- triggers below in the transaction of every change of herd_jobs. The claim locks a
-- key's row (SKIP LOCKED) before it takes that key's jobs, and the trigger raises
-- `claimed` under that lock: a second claimer skips the row, or, once the first
-- committed, re-reads the count it raised (PostgreSQL re-checks a locked row's latest
-- version). Releases only grow and are never folded into the row: a claimer whose
-- snapshot misses the newest ones under-counts the room, never over-counts it, and
-- completions never wait on a key's row nor hold it from a claim.
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
    claimed     bigint      NOT NULL DEFAULT 0,   -- jobs ever claimed (running + released)
    waiting     integer     NOT NULL DEFAULT 0,
    max_running integer     NOT NULL,         -- the latest enqueued job's limit
    served_at   timestamptz NOT NULL DEFAULT '-infinity',  -- its last turn in a claim
    PRIMARY KEY (queue, key)
);
-- Keys with waiting jobs, the least recently served first: the claim's turn order.
CREATE INDEX herd_key_counts_turn ON herd_key_counts (queue, served_at, key) WHERE waiting > 0;

CREATE TABLE herd_key_released (
    queue text     NOT NULL,
    key   text     NOT NULL,
    slot  smallint NOT NULL,
    n     bigint   NOT NULL,
    PRIMARY KEY (queue, key, slot)
);

CREATE FUNCTION herd_jobs_by_key_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_jobs WHERE concurrency_key IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    -- A job is enqueued pending: it waits.
    INSERT INTO herd_key_counts AS k (queue, key, waiting, max_running)
    SELECT queue, concurrency_key, count(*), (array_agg(key_limit ORDER BY id DESC))[1]
      FROM new_jobs WHERE concurrency_key IS NOT NULL
     GROUP BY queue, concurrency_key ORDER BY queue, concurrency_key
    ON CONFLICT (queue, key) DO UPDATE SET waiting = k.waiting + excluded.waiting,
           max_running = excluded.max_running;
    RETURN NULL;
END $$;

CREATE FUNCTION herd_jobs_by_key_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM new_jobs WHERE concurrency_key IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    -- A job's queue and key never change; only its status moves it between counts.
    -- Claims and waiting jobs go to the key's row (a claim holds it already); a job
    -- that leaves processing to its slot of herd_key_released, never to the row.
    WITH moved AS (
        SELECT n.queue, n.concurrency_key AS key,
               (n.status = 'processing' AND o.status <> 'processing')::int AS claim,
               (o.status = 'processing' AND n.status <> 'processing')::int AS release,
               (n.status = 'pending')::int - (o.status = 'pending')::int AS wait
          FROM old_jobs o JOIN new_jobs n USING (id)
         WHERE n.concurrency_key IS NOT NULL AND o.status <> n.status
    ), delta AS (
        SELECT queue, key, sum(claim) AS claim, sum(release) AS release, sum(wait) AS wait
          FROM moved GROUP BY queue, key
    ), rows AS (
        -- A key whose job was claimed goes to the back of the claims' turn order.
        INSERT INTO herd_key_counts AS k (queue, key, claimed, waiting, max_running)
        SELECT queue, key, claim, wait, 1 FROM delta
         WHERE claim <> 0 OR wait <> 0 ORDER BY queue, key
        ON CONFLICT (queue, key) DO UPDATE SET claimed = k.claimed + excluded.claimed,
               waiting = k.waiting + excluded.waiting,
               served_at = CASE WHEN excluded.claimed > 0 THEN clock_timestamp()
                                ELSE k.served_at END
    )
    INSERT INTO herd_key_released AS r (queue, key, slot, n)
    SELECT queue, key, pg_backend_pid() % 16, release FROM delta
     WHERE release <> 0 ORDER BY queue, key
    ON CONFLICT (queue, key, slot) DO UPDATE SET n = r.n + excluded.n;
    RETURN NULL;
END $$;

CREATE FUNCTION herd_jobs_by_key_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM old_jobs WHERE concurrency_key IS NOT NULL
                      AND status IN ('pending', 'processing')) THEN
        RETURN NULL;
    END IF;
    WITH delta AS (
        SELECT queue, concurrency_key AS key,
               count(*) FILTER (WHERE status = 'processing') AS release,
               count(*) FILTER (WHERE status = 'pending') AS wait
          FROM old_jobs WHERE concurrency_key IS NOT NULL
         GROUP BY queue, concurrency_key
    ), rows AS (
        INSERT INTO herd_key_counts AS k (queue, key, waiting, max_running)
        SELECT queue, key, -wait, 1 FROM delta WHERE wait <> 0 ORDER BY queue, key
        ON CONFLICT (queue, key) DO UPDATE SET waiting = k.waiting + excluded.waiting
    )
    INSERT INTO herd_key_released AS r (queue, key, slot, n)
    SELECT queue, key, pg_backend_pid() % 16, release FROM delta
     WHERE release <> 0 ORDER BY queue, key
    ON CONFLICT (queue, key, slot) DO UPDATE SET n = r.n + excluded.n;
    RETURN NULL;
END $$;

CREATE FUNCTION herd_jobs_by_key_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM herd_key_counts;
    DELETE FROM herd_key_released;
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
