-- The liveness mark a job's owner promised when it claimed the job: the key of the
-- session-level advisory lock its worker process holds on a connection of its own
-- (herd.db.postgres.SessionLock). NULL: no mark (a worker behind a transaction pooler
-- with no direct URL, or an older herd), so only the lease expiry frees the job.
ALTER TABLE herd_jobs ADD COLUMN lease_live bigint;
