-- The trace context a job was enqueued in (herd.telemetry): a propagator's carrier
-- as JSON, e.g. {"traceparent": "00-…-…-01"}, so that its runs continue that trace.
-- NULL: enqueued outside any trace, without OpenTelemetry, or by an older herd.
ALTER TABLE herd_jobs ADD COLUMN trace_context text;
