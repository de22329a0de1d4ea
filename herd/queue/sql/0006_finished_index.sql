-- Jobs finished per minute (the dashboard's throughput): succeeded jobs by
-- finish time, beside herd_jobs_dead for dead-lettered ones.
CREATE INDEX herd_jobs_finished ON herd_jobs (finished_at) WHERE status = 'succeeded';
