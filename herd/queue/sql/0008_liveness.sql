-- The liveness mark a job's owner promised when it claimed the job: the key of the
-- session-level advisory lock its worker process holds on a connection of its own
-- (herd.db.postgres.SessionLock). NULL: no mark (a worker behind a transaction pooler
-- with no direct URL, or an older herd), so only the lease expiry frees the job.
-- lease_live_at: when that claim was made. A server restart drops every session, so a
-- mark recorded before the server's start says nothing until its worker retakes it:
-- only jobs claimed since the start are taken over by their mark.
ALTER TABLE herd_jobs ADD COLUMN lease_live bigint, ADD COLUMN lease_live_at timestamptz;
