-- A batch in stages seen per stage (herd eval status, GET /evals/{batch}, the dashboard's
-- batch card) at a cost of O(stages), whatever its number of pieces: the read counted
-- every piece of the batch and joined every paid call of it to its pieces on each poll.
-- Now, as 3016 does for the items (and the dead jobs' pieces found as stageview says):
--
-- * the pieces are counted by (batch, stage, round, status, answered from the cache) in
--   counters kept exact by statement triggers in the transaction of every change of
--   herd_eval_pieces (a slot per backend pid, so workers ending pieces of one stage do
--   not queue on one row; readers sum them);
-- * a paid call (call, lost, failed, cut_short) is added to its stages' totals when its
--   ledger row is written closed or closes: the stages whose pieces of the batch asked
--   its key, or whose piece's job made it (a fallback answers under its own key). The
--   totals outlive the ledger's rows (HERD_LEDGER_TTL), which the read lost before.

CREATE TABLE herd_eval_piece_counts (
    batch  text     NOT NULL,
    stage  text     NOT NULL,
    round  integer  NOT NULL,
    status text     NOT NULL,
    cached boolean  NOT NULL,   -- answered from the exact cache (hit, waited, stale)
    slot   smallint NOT NULL,
    n      bigint   NOT NULL,
    PRIMARY KEY (batch, stage, round, status, cached, slot)
);

-- Rows inserted (TG_ARGV[0] = 1) or deleted (-1), as the transition table "changed".
CREATE FUNCTION herd_eval_pieces_count_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO herd_eval_piece_counts AS c (batch, stage, round, status, cached, slot, n)
    SELECT batch, stage, round, status, coalesce(source IN ('hit', 'waited', 'stale'), false),
           pg_backend_pid() % 16, TG_ARGV[0]::int * count(*)
      FROM changed GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3, 4, 5
    ON CONFLICT (batch, stage, round, status, cached, slot) DO UPDATE SET n = c.n + excluded.n;
    RETURN NULL;
END $$;

CREATE FUNCTION herd_eval_pieces_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH moved AS (
        SELECT o.status AS old_status,
               coalesce(o.source IN ('hit', 'waited', 'stale'), false) AS old_cached,
               n.batch, n.stage, n.round, n.status,
               coalesce(n.source IN ('hit', 'waited', 'stale'), false) AS cached
          FROM old_pieces o JOIN new_pieces n USING (batch, path, stage, round, seq)
         WHERE (o.status, coalesce(o.source IN ('hit', 'waited', 'stale'), false)) IS DISTINCT
               FROM (n.status, coalesce(n.source IN ('hit', 'waited', 'stale'), false))
    ), delta AS (
        SELECT batch, stage, round, old_status AS status, old_cached AS cached, -1 AS d
          FROM moved
        UNION ALL
        SELECT batch, stage, round, status, cached, 1 FROM moved
    )
    INSERT INTO herd_eval_piece_counts AS c (batch, stage, round, status, cached, slot, n)
    SELECT batch, stage, round, status, cached, pg_backend_pid() % 16, sum(d)
      FROM delta GROUP BY 1, 2, 3, 4, 5 HAVING sum(d) <> 0 ORDER BY 1, 2, 3, 4, 5
    ON CONFLICT (batch, stage, round, status, cached, slot) DO UPDATE SET n = c.n + excluded.n;
    RETURN NULL;
END $$;

CREATE FUNCTION herd_eval_pieces_count_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM herd_eval_piece_counts;
    RETURN NULL;
END $$;

CREATE TABLE herd_eval_stage_costs (
    batch         text     NOT NULL,
    stage         text     NOT NULL,
    slot          smallint NOT NULL,
    n             bigint   NOT NULL,
    input_tokens  bigint   NOT NULL,
    output_tokens bigint   NOT NULL,
    cost          numeric  NOT NULL,   -- of the priced calls
    unpriced      bigint   NOT NULL,   -- calls without a price: the stage's cost is unknown
    PRIMARY KEY (batch, stage, slot)
);

-- The paid calls of a statement's rows (their ids: an AFTER trigger reads them back),
-- each added to every stage it served, once per stage.
CREATE FUNCTION herd_eval_stage_costs_add(paid bigint[]) RETURNS void
LANGUAGE sql AS $$
    WITH r AS (SELECT * FROM herd_eval_ledger WHERE id = ANY(paid)),
    x AS (
        SELECT r.id, p.stage, r.batch, r.input_tokens, r.output_tokens, r.cost
          FROM r JOIN herd_eval_pieces p ON p.batch = r.batch AND p.key = r.key
        UNION
        SELECT r.id, p.stage, r.batch, r.input_tokens, r.output_tokens, r.cost
          FROM r JOIN herd_eval_pieces p ON p.job_id = r.job_id AND p.batch = r.batch
    )
    INSERT INTO herd_eval_stage_costs AS c (batch, stage, slot, n, input_tokens,
                                            output_tokens, cost, unpriced)
    SELECT batch, stage, pg_backend_pid() % 16, count(*), sum(input_tokens),
           sum(output_tokens), coalesce(sum(cost), 0), count(*) FILTER (WHERE cost IS NULL)
      FROM x GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (batch, stage, slot) DO UPDATE
       SET n = c.n + excluded.n, input_tokens = c.input_tokens + excluded.input_tokens,
           output_tokens = c.output_tokens + excluded.output_tokens,
           cost = c.cost + excluded.cost, unpriced = c.unpriced + excluded.unpriced;
$$;

CREATE FUNCTION herd_eval_ledger_stage_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM herd_eval_stage_costs_add(ARRAY(
        SELECT l.id FROM new_rows l
         WHERE l.state = 'closed' AND l.batch IS NOT NULL
           AND l.kind IN ('call', 'lost', 'failed', 'cut_short')));
    RETURN NULL;
END $$;

CREATE FUNCTION herd_eval_ledger_stage_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM herd_eval_stage_costs_add(ARRAY(
        SELECT n.id FROM new_rows n JOIN old_rows o USING (id)
         WHERE n.state = 'closed' AND o.state <> 'closed' AND n.batch IS NOT NULL
           AND n.kind IN ('call', 'lost', 'failed', 'cut_short')));
    RETURN NULL;
END $$;

-- A paid call's stages, and a dead job's pieces, found by the job, not by a walk of the
-- batch's pieces; and the status read's sweep of the waiting pieces' jobs, a page at a
-- time along the waiting ones only (herd.llm.eval.stageview).
CREATE INDEX herd_eval_pieces_job ON herd_eval_pieces (job_id) WHERE job_id IS NOT NULL;
CREATE INDEX herd_eval_pieces_waiting ON herd_eval_pieces (batch, path, stage, round, seq)
    WHERE status = 'queued' AND job_id IS NOT NULL;

-- Counted and summed under locks that keep writers out until COMMIT: no change can fall
-- between the first count and the triggers.
LOCK TABLE herd_eval_pieces, herd_eval_ledger IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO herd_eval_piece_counts (batch, stage, round, status, cached, slot, n)
SELECT batch, stage, round, status, coalesce(source IN ('hit', 'waited', 'stale'), false),
       0, count(*)
  FROM herd_eval_pieces GROUP BY 1, 2, 3, 4, 5;

SELECT herd_eval_stage_costs_add(ARRAY(
    SELECT l.id FROM herd_eval_ledger l
     WHERE l.state = 'closed' AND l.batch IS NOT NULL
       AND l.kind IN ('call', 'lost', 'failed', 'cut_short')
       AND l.batch IN (SELECT DISTINCT batch FROM herd_eval_pieces)));

CREATE TRIGGER herd_eval_pieces_count_insert AFTER INSERT ON herd_eval_pieces
    REFERENCING NEW TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION herd_eval_pieces_count_rows('1');
CREATE TRIGGER herd_eval_pieces_count_update AFTER UPDATE ON herd_eval_pieces
    REFERENCING OLD TABLE AS old_pieces NEW TABLE AS new_pieces
    FOR EACH STATEMENT EXECUTE FUNCTION herd_eval_pieces_count_update();
CREATE TRIGGER herd_eval_pieces_count_delete AFTER DELETE ON herd_eval_pieces
    REFERENCING OLD TABLE AS changed
    FOR EACH STATEMENT EXECUTE FUNCTION herd_eval_pieces_count_rows('-1');
CREATE TRIGGER herd_eval_pieces_count_truncate AFTER TRUNCATE ON herd_eval_pieces
    FOR EACH STATEMENT EXECUTE FUNCTION herd_eval_pieces_count_truncate();
CREATE TRIGGER herd_eval_ledger_stage_insert AFTER INSERT ON herd_eval_ledger
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION herd_eval_ledger_stage_insert();
CREATE TRIGGER herd_eval_ledger_stage_update AFTER UPDATE ON herd_eval_ledger
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION herd_eval_ledger_stage_update();
