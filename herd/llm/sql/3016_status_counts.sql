-- A batch's status read (herd eval status, GET /evals/{batch}, the dashboard's batch
-- card) costs O(active work), whatever the number of documents waiting: it read every
-- waiting item and fetched each one's job (3.5 s at 20,000 queued). Now:
--
-- * the items are counted by (batch, status, staged) in counters kept exact by
--   statement triggers in the same transaction as every change of herd_eval_items
--   (the scheme of herd_job_counts, herd.queue.sql 0007: a slot per backend pid, so
--   workers finishing jobs of one batch do not queue on one row; readers sum them);
-- * an item whose job died or is gone is recorded in herd_eval_failures when that is
--   learnt (by its task on its last attempt, or by the status read's bounded sweep);
--   the record holds while the item still waits on that very job;
-- * a job whose end updated no item (its items not yet stored: submit enqueues, then
--   inserts) leaves its answer in herd_eval_job_answers, and an item stored after its
--   job's end takes its answer at insert: the two meet under an advisory lock of the
--   job's bucket (herd.llm.eval.store.JOIN_LOCK), so neither misses the other;
-- * a batch's specs and its recent answers are read from their own rows and index.

CREATE TABLE herd_eval_item_counts (
    batch  text     NOT NULL,
    status text     NOT NULL,
    staged boolean  NOT NULL,   -- a pipeline's document (its jobs are its pieces')
    slot   smallint NOT NULL,
    n      bigint   NOT NULL,
    PRIMARY KEY (batch, status, staged, slot)
);

CREATE FUNCTION herd_eval_items_count_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO herd_eval_item_counts AS c (batch, status, staged, slot, n)
    SELECT batch, status, pipeline IS NOT NULL, pg_backend_pid() % 16, count(*)
      FROM new_items GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (batch, status, staged, slot) DO UPDATE SET n = c.n + excluded.n;
    RETURN NULL;
END $$;

CREATE FUNCTION herd_eval_items_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH moved AS (
        SELECT o.batch AS old_batch, o.status AS old_status,
               o.pipeline IS NOT NULL AS old_staged,
               n.batch, n.status, n.pipeline IS NOT NULL AS staged
          FROM old_items o JOIN new_items n USING (batch, path)
         WHERE (o.status, o.pipeline IS NOT NULL) IS DISTINCT FROM
               (n.status, n.pipeline IS NOT NULL)
    ), delta AS (
        SELECT old_batch AS batch, old_status AS status, old_staged AS staged, -1 AS d
          FROM moved
        UNION ALL
        SELECT batch, status, staged, 1 FROM moved
    )
    INSERT INTO herd_eval_item_counts AS c (batch, status, staged, slot, n)
    SELECT batch, status, staged, pg_backend_pid() % 16, sum(d)
      FROM delta GROUP BY 1, 2, 3 HAVING sum(d) <> 0 ORDER BY 1, 2, 3
    ON CONFLICT (batch, status, staged, slot) DO UPDATE SET n = c.n + excluded.n;
    RETURN NULL;
END $$;

CREATE FUNCTION herd_eval_items_count_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO herd_eval_item_counts AS c (batch, status, staged, slot, n)
    SELECT batch, status, pipeline IS NOT NULL, pg_backend_pid() % 16, -count(*)
      FROM old_items GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (batch, status, staged, slot) DO UPDATE SET n = c.n + excluded.n;
    RETURN NULL;
END $$;

CREATE FUNCTION herd_eval_items_count_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM herd_eval_item_counts;
    DELETE FROM herd_eval_failures;
    RETURN NULL;
END $$;

CREATE TABLE herd_eval_failures (
    batch  text        NOT NULL,
    path   text        NOT NULL,
    job_id bigint      NOT NULL,   -- valid while the item still waits on this job
    kind   text        NOT NULL CHECK (kind IN ('dead', 'lost')),
    at     timestamptz NOT NULL DEFAULT now(),
    -- No foreign key: a TRUNCATE of the items alone must not be refused. Records of
    -- items no longer waiting match nothing and are purged (purge_failures).
    PRIMARY KEY (batch, path)
);
CREATE INDEX herd_eval_failures_job ON herd_eval_failures (job_id);

CREATE TABLE herd_eval_job_answers (
    job_id bigint      NOT NULL,
    key    text        NOT NULL,
    source text,
    result jsonb       NOT NULL,
    at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, key)
);
CREATE INDEX herd_eval_job_answers_at ON herd_eval_job_answers (at);

CREATE TABLE herd_eval_batch_specs (
    batch text NOT NULL,
    spec  text NOT NULL,
    PRIMARY KEY (batch, spec)
);

-- A batch's waiting items in path order (the sweep; the first failures shown), without
-- walking its answered ones.
CREATE INDEX herd_eval_items_waiting ON herd_eval_items (batch, path)
    WHERE status IN ('queued', 'parked');

-- A batch's pipeline, and the first of its documents a stage failed: index entries of
-- a pipeline's items and of failed ones, not a walk of every item.
CREATE INDEX herd_eval_items_staged ON herd_eval_items (batch) WHERE pipeline IS NOT NULL;
CREATE INDEX herd_eval_items_failed ON herd_eval_items (batch, path) WHERE status = 'failed';

-- The rate and ETA: the batch's answers of the last minute and its first, along an index.
CREATE INDEX herd_eval_items_done_at ON herd_eval_items (batch, finished_at)
    WHERE status = 'done';

-- Counted and copied under a lock that keeps writers out until COMMIT: no change can
-- fall between the first count and the triggers.
LOCK TABLE herd_eval_items IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO herd_eval_item_counts (batch, status, staged, slot, n)
SELECT batch, status, pipeline IS NOT NULL, 0, count(*) FROM herd_eval_items GROUP BY 1, 2, 3;

INSERT INTO herd_eval_batch_specs (batch, spec)
SELECT DISTINCT batch, spec FROM herd_eval_items WHERE spec IS NOT NULL;

CREATE TRIGGER herd_eval_items_count_insert AFTER INSERT ON herd_eval_items
    REFERENCING NEW TABLE AS new_items
    FOR EACH STATEMENT EXECUTE FUNCTION herd_eval_items_count_insert();
CREATE TRIGGER herd_eval_items_count_update AFTER UPDATE ON herd_eval_items
    REFERENCING OLD TABLE AS old_items NEW TABLE AS new_items
    FOR EACH STATEMENT EXECUTE FUNCTION herd_eval_items_count_update();
CREATE TRIGGER herd_eval_items_count_delete AFTER DELETE ON herd_eval_items
    REFERENCING OLD TABLE AS old_items
    FOR EACH STATEMENT EXECUTE FUNCTION herd_eval_items_count_delete();
CREATE TRIGGER herd_eval_items_count_truncate AFTER TRUNCATE ON herd_eval_items
    FOR EACH STATEMENT EXECUTE FUNCTION herd_eval_items_count_truncate();
