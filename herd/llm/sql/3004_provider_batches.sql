-- Batches submitted to a provider's Batch API (herd.llm.batchapi). One row per chunk of
-- a (batch, spec), written (fenced) before anything is uploaded: its handle names the
-- provider's file and is the provider batch's metadata, so a worker taking the job over
-- finds what was made before it and makes nothing twice. file_id and provider_batch_id
-- are recorded (fenced) once known. state: submitting, polling, done.
-- polls: checks made so far (the next one backs off from it).
-- Purged with the batch's items (HERD_EVAL_TTL) once done.
CREATE TABLE herd_eval_provider_batches (
    handle            text PRIMARY KEY,
    chunk             text NOT NULL UNIQUE,
    batch             text NOT NULL,
    spec              text NOT NULL,
    provider          text NOT NULL,
    file_id           text,
    provider_batch_id text,
    state             text NOT NULL DEFAULT 'submitting'
                      CHECK (state IN ('submitting', 'polling', 'done')),
    status            text,
    polls             integer NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX herd_eval_provider_batches_done ON herd_eval_provider_batches (updated_at)
    WHERE state = 'done';
