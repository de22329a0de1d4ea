-- Evaluations in stages (herd.llm.eval.pipeline): split, map, reduce, chain.
-- A pipeline's document keeps its one row in herd_eval_items (its final answer, what
-- status and results read); its stages' calls are pieces here, one per call.
CREATE TABLE herd_eval_pipelines (
    hash       text PRIMARY KEY,       -- sha256 of the canonical pipeline
    pipeline   jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The item of a pipeline's document names its pipeline; its jobs are the pieces' own,
-- so the settling of single-prompt items (by their job) leaves it alone.
ALTER TABLE herd_eval_items ADD COLUMN pipeline text;
ALTER TABLE herd_eval_items DROP CONSTRAINT herd_eval_items_status_check;
ALTER TABLE herd_eval_items ADD CONSTRAINT herd_eval_items_status_check
    CHECK (status IN ('queued', 'parked', 'done', 'cancelled', 'failed'));

-- One row per call of a stage: a piece of a map stage, the one input of a per-document
-- stage (reduce, chain). job_id NULL: decided (by the fan-in) but not yet enqueued.
CREATE TABLE herd_eval_pieces (
    batch       text    NOT NULL,
    path        text    NOT NULL,
    stage       text    NOT NULL,
    seq         integer NOT NULL,
    key         text    NOT NULL,
    spec        text    NOT NULL,
    doc         text    NOT NULL,     -- hash of the input text (herd_eval_documents)
    loc         jsonb   NOT NULL DEFAULT '{}'::jsonb,
    job_id      bigint,
    status      text    NOT NULL DEFAULT 'queued'
                CHECK (status IN ('queued', 'done', 'failed', 'cancelled')),
    source      text,
    result      jsonb,
    error       text,
    finished_at timestamptz,
    PRIMARY KEY (batch, path, stage, seq)
);
CREATE INDEX herd_eval_pieces_unsent ON herd_eval_pieces (batch, path) WHERE job_id IS NULL;
CREATE INDEX herd_eval_pieces_key ON herd_eval_pieces (batch, key);

-- The fan-in: a document's pieces of a map stage still open. The completion that brings
-- it to zero decides the next stage, in the same fenced transaction.
CREATE TABLE herd_eval_fanin (
    batch  text    NOT NULL,
    path   text    NOT NULL,
    stage  text    NOT NULL,
    open   integer NOT NULL CHECK (open >= 0),
    total  integer NOT NULL,
    PRIMARY KEY (batch, path, stage)
);
