-- Ready jobs without a concurrency key, for the claim's walk over them. Along
-- herd_jobs_ready the claim stepped over every pending keyed job before it reached one
-- without a key: with a keyed backlog of 20,000 that walk was 2.3 ms of a 3 ms claim,
-- and it grew with the backlog. herd_jobs_ready stays for the readers of the whole
-- pending order (the stats' head of the line, next_due).
CREATE INDEX herd_jobs_ready_free ON herd_jobs (queue, priority DESC, id)
    WHERE status = 'pending' AND concurrency_key IS NULL;
