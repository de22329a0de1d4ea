-- Ready counts without visiting the pending rows: stats() read ready as a count of
-- pending jobs with run_at <= now(), which walks every pending index entry (58-69 ms
-- at 10,000 pending) and, right after a drain, the dead entries of those claimed
-- since (48 ms after 300,000, until autovacuum). Now the counters also keep how many
-- pending jobs are due in the future, by the second they fall due, and
--     ready = pending - (jobs in buckets still in the future)
-- reads a few rows whatever the backlog. Time alone makes a job ready (no write
-- happens when its run_at passes): its bucket simply stops counting once it is in
-- the past, so nothing has to promote it.
--
-- A bucket is the second after run_at (run_at rounded up): a delayed job counts as
-- ready at most 1 s after it became due, never before. Only jobs written with
-- run_at > now() are counted, and only those leaving pending (or moving) while
-- run_at > now() are taken out: a claim takes jobs with run_at <= now(), so a claim
-- never writes here, and neither does an enqueue without a delay. Within that last
-- second a claimed job may still be counted as scheduled (ready reads one low, never
-- below 0, for under a second); any such drift sits in a bucket that soon passes.
-- Slots by backend pid as in herd_job_counts; the purge tick deletes past buckets.
-- Locks: after the job rows and herd_job_counts' rows, in (due, queue) order.

CREATE TABLE herd_job_scheduled (
    due   timestamptz NOT NULL,
    queue text        NOT NULL,
    slot  smallint    NOT NULL,
    n     bigint      NOT NULL,
    PRIMARY KEY (due, queue, slot)
);

CREATE OR REPLACE FUNCTION herd_jobs_count_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO herd_job_counts AS c (queue, status, slot, n)
    SELECT queue, status, pg_backend_pid() % 16, count(*)
      FROM new_jobs GROUP BY queue, status ORDER BY queue, status
    ON CONFLICT (queue, status, slot) DO UPDATE SET n = c.n + excluded.n;
    INSERT INTO herd_job_scheduled AS s (due, queue, slot, n)
    SELECT date_trunc('second', run_at) + interval '1 second', queue, pg_backend_pid() % 16,
           count(*)
      FROM new_jobs WHERE status = 'pending' AND run_at > now()
     GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (due, queue, slot) DO UPDATE SET n = s.n + excluded.n;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION herd_jobs_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
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
    -- A retry or release with a delay, a reschedule: out of the old bucket, into the new.
    WITH sched AS (
        SELECT date_trunc('second', run_at) + interval '1 second' AS due, queue, -1 AS d
          FROM old_jobs WHERE status = 'pending' AND run_at > now()
        UNION ALL
        SELECT date_trunc('second', run_at) + interval '1 second', queue, 1
          FROM new_jobs WHERE status = 'pending' AND run_at > now()
    )
    INSERT INTO herd_job_scheduled AS s (due, queue, slot, n)
    SELECT due, queue, pg_backend_pid() % 16, sum(d)
      FROM sched GROUP BY due, queue HAVING sum(d) <> 0 ORDER BY due, queue
    ON CONFLICT (due, queue, slot) DO UPDATE SET n = s.n + excluded.n;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION herd_jobs_count_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO herd_job_counts AS c (queue, status, slot, n)
    SELECT queue, status, pg_backend_pid() % 16, -count(*)
      FROM old_jobs GROUP BY queue, status ORDER BY queue, status
    ON CONFLICT (queue, status, slot) DO UPDATE SET n = c.n + excluded.n;
    INSERT INTO herd_job_scheduled AS s (due, queue, slot, n)
    SELECT date_trunc('second', run_at) + interval '1 second', queue, pg_backend_pid() % 16,
           -count(*)
      FROM old_jobs WHERE status = 'pending' AND run_at > now()
     GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (due, queue, slot) DO UPDATE SET n = s.n + excluded.n;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION herd_jobs_count_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM herd_job_counts;
    DELETE FROM herd_job_throughput;
    DELETE FROM herd_job_scheduled;
    RETURN NULL;
END $$;

-- The jobs already waiting for their time, counted under a lock that keeps writers
-- out until COMMIT (the functions above take effect with it).
LOCK TABLE herd_jobs IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO herd_job_scheduled (due, queue, slot, n)
SELECT date_trunc('second', run_at) + interval '1 second', queue, 0, count(*)
  FROM herd_jobs WHERE status = 'pending' AND run_at > now()
 GROUP BY 1, 2;

-- The dead letters newest first (the dashboard's list, list_jobs with status 'dead'):
-- without it, and before the first ANALYZE after a drain, the planner walked the
-- primary key backwards through every finished job looking for dead ones (120-540 ms
-- just after 300,000 succeeded). Written only when a job is dead-lettered.
CREATE INDEX herd_jobs_dead_id ON herd_jobs (id) WHERE status = 'dead';
