-- Ready jobs and the oldest of them without visiting each pending row: stats()
-- takes the pending count from herd_job_counts and subtracts the delayed jobs
-- (run_at in the future, usually few), and reads the oldest run_at per queue as
-- the first entry here. A backlog of 50,000 ready jobs then costs two probes.
CREATE INDEX herd_jobs_pending_run_at ON herd_jobs (queue, run_at) WHERE status = 'pending';
