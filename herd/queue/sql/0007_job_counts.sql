-- Counts per queue and status, and jobs finished per minute, kept exact by triggers
-- in the same transaction as every change of herd_jobs, so that stats() and
-- throughput() read a few rows per queue instead of counting the job history.
--
-- Statement-level triggers with transition tables: one upsert per (queue, status)
-- per statement, however many rows it changed (a claim of 100 jobs is two upserts).
-- A counter is split into slots by the writing backend's pid: thousands of claims a
-- second on one row would serialize on its row lock, while each pooled connection
-- mostly writes its own slot. A slot may go negative (a job enqueued on one
-- connection and claimed on another); readers sum the slots, and the purge tick
-- folds them back into slot 0 now and then.
--
-- Row locks on counters are always taken in (queue, status) order and after the
-- statement's job-row locks, so that two statements never wait on each other in a
-- cycle.

CREATE TABLE herd_job_counts (
    queue  text     NOT NULL,
    status text     NOT NULL,
    slot   smallint NOT NULL,
    n      bigint   NOT NULL,
    PRIMARY KEY (queue, status, slot)
);

-- Jobs that reached succeeded or dead per minute of finished_at; kept for
-- HERD_THROUGHPUT_TTL (2 days by default), whatever becomes of the jobs themselves.
CREATE TABLE herd_job_throughput (
    minute timestamptz NOT NULL,
    queue  text        NOT NULL,
    status text        NOT NULL CHECK (status IN ('succeeded', 'dead')),
    slot   smallint    NOT NULL,
    n      bigint      NOT NULL,
    PRIMARY KEY (minute, queue, status, slot)
);

CREATE FUNCTION herd_jobs_count_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO herd_job_counts AS c (queue, status, slot, n)
    SELECT queue, status, pg_backend_pid() % 16, count(*)
      FROM new_jobs GROUP BY queue, status ORDER BY queue, status
    ON CONFLICT (queue, status, slot) DO UPDATE SET n = c.n + excluded.n;
    RETURN NULL;
END $$;

CREATE FUNCTION herd_jobs_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH moved AS (
        SELECT o.queue AS old_queue, o.status AS old_status, n.queue, n.status, n.finished_at
          FROM old_jobs o JOIN new_jobs n USING (id)
         WHERE (o.queue, o.status) IS DISTINCT FROM (n.queue, n.status)
    ), finished AS (
        INSERT INTO herd_job_throughput AS t (minute, queue, status, slot, n)
        SELECT date_trunc('minute', coalesce(finished_at, now())), queue, status,
               pg_backend_pid() % 16, count(*)
          FROM moved WHERE status IN ('succeeded', 'dead') AND old_status <> status
         GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (minute, queue, status, slot) DO UPDATE SET n = t.n + excluded.n
    ), delta AS (
        SELECT old_queue AS queue, old_status AS status, -1 AS d FROM moved
        UNION ALL
        SELECT queue, status, 1 FROM moved
    )
    INSERT INTO herd_job_counts AS c (queue, status, slot, n)
    SELECT queue, status, pg_backend_pid() % 16, sum(d)
      FROM delta GROUP BY queue, status HAVING sum(d) <> 0 ORDER BY queue, status
    ON CONFLICT (queue, status, slot) DO UPDATE SET n = c.n + excluded.n;
    RETURN NULL;
END $$;

CREATE FUNCTION herd_jobs_count_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO herd_job_counts AS c (queue, status, slot, n)
    SELECT queue, status, pg_backend_pid() % 16, -count(*)
      FROM old_jobs GROUP BY queue, status ORDER BY queue, status
    ON CONFLICT (queue, status, slot) DO UPDATE SET n = c.n + excluded.n;
    RETURN NULL;
END $$;

-- TRUNCATE herd_jobs starts the job store afresh: its counts and throughput go too.
CREATE FUNCTION herd_jobs_count_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM herd_job_counts;
    DELETE FROM herd_job_throughput;
    RETURN NULL;
END $$;

-- Written before the triggers exist, under a lock that keeps writers out until
-- COMMIT: no change can fall between the first count and the triggers.
LOCK TABLE herd_jobs IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO herd_job_counts (queue, status, slot, n)
SELECT queue, status, 0, count(*) FROM herd_jobs GROUP BY queue, status;

INSERT INTO herd_job_throughput (minute, queue, status, slot, n)
SELECT date_trunc('minute', finished_at), queue, status, 0, count(*) FROM herd_jobs
 WHERE status IN ('succeeded', 'dead') AND finished_at >= now() - interval '2 days'
 GROUP BY 1, 2, 3;

CREATE TRIGGER herd_jobs_count_insert AFTER INSERT ON herd_jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION herd_jobs_count_insert();
CREATE TRIGGER herd_jobs_count_update AFTER UPDATE ON herd_jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION herd_jobs_count_update();
CREATE TRIGGER herd_jobs_count_delete AFTER DELETE ON herd_jobs
    REFERENCING OLD TABLE AS old_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION herd_jobs_count_delete();
CREATE TRIGGER herd_jobs_count_truncate AFTER TRUNCATE ON herd_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION herd_jobs_count_truncate();
