-- LLM evaluations (herd.llm.evaluate). Jobs carry only hashes; the texts live here.
CREATE TABLE herd_eval_documents (
    hash       text PRIMARY KEY,       -- sha256 of the normalized text
    text       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE herd_eval_specs (
    hash       text PRIMARY KEY,       -- sha256 of the canonical spec
    spec       jsonb NOT NULL,         -- model, provider, system prompt, schema, params
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The cost ledger: one row per provider call made, and per call avoided.
-- kind: call (paid), lost (paid, then abandoned: its lease was lost), cache (avoided:
-- the result was stored), singleflight (avoided: another worker was computing it),
-- dedup (avoided: the same evaluation was already queued).
CREATE TABLE herd_eval_ledger (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT now(),
    batch         text,
    job_id        bigint,
    key           text NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('call', 'lost', 'cache', 'singleflight', 'dedup')),
    model         text,
    provider      text,
    input_tokens  bigint NOT NULL DEFAULT 0,
    output_tokens bigint NOT NULL DEFAULT 0,
    cost          float8            -- NULL: no price known for the model
);
CREATE INDEX herd_eval_ledger_batch ON herd_eval_ledger (batch, kind);

-- One row per submitted document: what `herd eval status` and `results` read.
-- Written by the evaluation task when its job succeeds (fenced by the job's lease
-- on the PostgreSQL broker); a dead-lettered job's row stays 'queued'.
CREATE TABLE herd_eval_items (
    batch       text   NOT NULL,
    path        text   NOT NULL,
    key         text   NOT NULL,
    job_id      bigint NOT NULL,
    status      text   NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'done')),
    source      text,             -- computed / hit / waited / stale / early
    result      jsonb,
    finished_at timestamptz,
    PRIMARY KEY (batch, path)
);
