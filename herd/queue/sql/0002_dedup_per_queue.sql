-- Dedup keys are scoped to their queue, as on Redis, where a queue's keys share
-- one cluster slot and a key spanning queues could not be checked atomically.
DROP INDEX herd_jobs_dedup;
CREATE UNIQUE INDEX herd_jobs_dedup ON herd_jobs (queue, dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('pending', 'processing');
