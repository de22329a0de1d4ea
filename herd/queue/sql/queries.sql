-- Every statement the PostgreSQL broker sends, one block per verb.
-- Multi-row writes lock their rows in id order first, so that a worker's
-- renewal and its batched completions can never deadlock each other.

-- name: enqueue
-- The batch comes as one JSON array (herd.queue.postgres._enqueue_params): the server
-- parses it in C, where ten parameter arrays cost the client ~50 us a job to build.
-- Its order is the input's (ids ascend in it). The queues that got jobs are woken in
-- the same statement (NOTIFY is sent at its commit): one round trip for a batch,
-- where BEGIN, the insert, the notify and COMMIT apart took four.
WITH new AS (
INSERT INTO herd_jobs (queue, task, payload, priority, dedup_key, run_at,
                       lease_seconds, max_attempts, max_stalls, trace_context,
                       concurrency_key, key_limit)
SELECT e.j->>'queue', e.j->>'task', e.j->'payload', (e.j->>'priority')::int,
       e.j->>'dedup_key', now() + (e.j->>'delay')::float8 * interval '1 second',
       (e.j->>'lease_seconds')::float8, (e.j->>'max_attempts')::int,
       (e.j->>'max_stalls')::int, e.j->>'trace_context',
       e.j->>'concurrency_key', (e.j->>'key_limit')::int
  FROM jsonb_array_elements(%(jobs)s::jsonb) WITH ORDINALITY AS e(j, ord)
 ORDER BY e.ord
ON CONFLICT (queue, dedup_key) WHERE dedup_key IS NOT NULL AND status IN ('pending', 'processing')
DO NOTHING
RETURNING id, queue, dedup_key
), woken AS (
    SELECT pg_notify('herd_jobs', queue) FROM (SELECT DISTINCT queue FROM new) q
)
SELECT id, queue, dedup_key FROM new WHERE (SELECT count(*) FROM woken) > 0;

-- name: active_by_dedup_key
SELECT j.id, j.queue, j.dedup_key FROM herd_jobs j
  JOIN unnest(%(queues)s::text[], %(keys)s::text[]) AS k(queue, dedup_key)
    ON j.queue = k.queue AND j.dedup_key = k.dedup_key
 WHERE j.status IN ('pending', 'processing');

-- name: notify
SELECT pg_notify('herd_jobs', q) FROM unnest(%(queues)s::text[]) AS q;

-- name: claim
-- Ready jobs and jobs whose lease expired (their worker died or froze), by
-- priority then age. A takeover counts a stall; too many stalls dead-letter
-- the job instead of handing it out again.
-- Jobs with a concurrency key (0011) take turns per key: the keys with waiting jobs
-- and room (claimed - released < max_running), least recently served first, each
-- locked (SKIP LOCKED: a key another claimer holds is skipped, never waited for)
-- before its jobs are taken, at most its room. The trigger raises the key's running
-- count under that lock, and sends each key served to the back of the turn order
-- (served_at). Of all the candidates, keyed or not, expired or ready: by priority,
-- then by turn (the first job of every key before the second of any; a job
-- without a key counts as a key of its own), then by age. So neither kind waits behind
-- the other: a keyed backlog does not hold back older or higher jobs without a key,
-- nor the reverse.
-- An expired keyed job is taken over only under its key's lock too, since a stall
-- that dead-letters it gives its slot back. Without keyed jobs in the queue, `keys`
-- and `expired_keys` find nothing and the claim is as before.
WITH ready AS (
    SELECT id, priority, NULL::text AS ckey, 1::bigint AS rn FROM herd_jobs
     WHERE status = 'pending' AND queue = %(queue)s AND run_at <= now()
       AND concurrency_key IS NULL
     ORDER BY priority DESC, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), keys AS (
    SELECT key, max_running - k.claimed + r.n AS room
      FROM herd_key_counts k
     CROSS JOIN LATERAL (SELECT coalesce(sum(n), 0) AS n FROM herd_key_released r
                          WHERE r.queue = %(queue)s AND r.key = k.key) r
     WHERE queue = %(queue)s AND waiting > 0 AND k.claimed - r.n < max_running
       -- A key whose waiting jobs are all delayed must not hold the front. A scalar
       -- subquery (LIMIT 1), one probe of herd_jobs_ready_key per key looked at: as
       -- EXISTS the planner may join every pending job instead. Its ORDER BY is the
       -- index's: without it, statistics that say most pending jobs are this key's
       -- (one hot key) make a sequential scan look cheapest, and that scan walks every
       -- finished job ahead of the first pending one, so each claim cost more as the
       -- key's history grew (1 key at limit 2: 895 jobs/s over 2,000 jobs, 564/s
       -- over 10,000).
       AND (SELECT true FROM herd_jobs j
             WHERE j.status = 'pending' AND j.queue = %(queue)s
               AND j.concurrency_key = k.key AND j.run_at <= now()
             ORDER BY j.priority DESC, j.id
             LIMIT 1)
     ORDER BY served_at, key
     LIMIT %(limit)s
       FOR UPDATE OF k SKIP LOCKED
), keyed AS (
    SELECT c.id, c.priority, k.key AS ckey,
           row_number() OVER (PARTITION BY k.key ORDER BY c.priority DESC, c.id) AS rn
      FROM keys k CROSS JOIN LATERAL (
        SELECT id, priority FROM herd_jobs
         WHERE status = 'pending' AND queue = %(queue)s AND concurrency_key = k.key
           AND run_at <= now()
         ORDER BY priority DESC, id
         LIMIT least(k.room, %(limit)s)
           FOR UPDATE SKIP LOCKED) c
), expired AS (
    SELECT id, priority, concurrency_key AS ckey, 1::bigint AS rn
      FROM herd_jobs
     WHERE status = 'processing' AND queue = %(queue)s AND lease_expires_at < now()
     ORDER BY priority DESC, id
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), expired_keys AS (
    SELECT key FROM herd_key_counts
     WHERE queue = %(queue)s AND key IN (SELECT ckey FROM expired WHERE ckey IS NOT NULL)
       AND key NOT IN (SELECT key FROM keys)
       FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id FROM (
        SELECT * FROM keyed
        UNION ALL SELECT * FROM ready
        UNION ALL SELECT * FROM expired
         WHERE ckey IS NULL OR ckey IN (SELECT key FROM expired_keys)
            OR ckey IN (SELECT key FROM keys)) c
     ORDER BY priority DESC, rn, id LIMIT %(limit)s
)
UPDATE herd_jobs j SET
    lease_token      = j.lease_token + 1,
    stalls           = j.stalls + (j.status = 'processing')::int,
    status           = CASE WHEN j.status = 'processing' AND j.stalls + 1 > j.max_stalls
                            THEN 'dead' ELSE 'processing' END,
    dead_reason      = CASE WHEN j.status = 'processing' AND j.stalls + 1 > j.max_stalls
                            THEN 'max_stalls' END,
    last_error       = CASE WHEN j.status = 'processing'
                            THEN 'lease expired while held by ' || coalesce(j.lease_owner, '?')
                            ELSE j.last_error END,
    finished_at      = CASE WHEN j.status = 'processing' AND j.stalls + 1 > j.max_stalls
                            THEN now() END,
    lease_owner      = %(owner)s,
    lease_live       = %(live)s,
    lease_live_at    = now(),
    lease_expires_at = now() + j.lease_seconds * interval '1 second',
    started_at       = coalesce(j.started_at, now()),
    last_worker      = %(owner)s
  FROM picked
 WHERE j.id = picked.id
RETURNING j.id AS job_id, j.lease_token AS token, j.task, j.queue, j.payload, j.attempts,
          j.stalls, j.max_attempts, j.lease_seconds, j.lease_expires_at AS expires_at, j.status,
          j.trace_context, j.concurrency_key;

-- name: claim_orphans
-- Jobs whose lease still runs but whose owner's liveness mark is gone: the
-- session-level advisory lock (key lease_live) its worker process held on a
-- connection of its own, which the server drops with that connection (a killed
-- process). A frozen process keeps its socket and its lock: its jobs wait for the
-- lease expiry, through the claim above. A takeover counts a stall, as there.
-- Candidates come from the statement's snapshot and are taken only under the token
-- seen: a job claimed anew since, by a worker whose lock this look at pg_locks may
-- have missed, is left alone. Runs now and then, not on every claim (pg_locks reads
-- the server's whole lock table): the broker calls it every ORPHAN_CHECK seconds.
WITH held AS MATERIALIZED (
    SELECT (l.classid::int8 << 32) | l.objid::int8 AS key FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
), orphans AS (
    SELECT id, lease_token FROM herd_jobs
     WHERE status = 'processing' AND queue = %(queue)s AND lease_expires_at >= now()
       AND lease_live IS NOT NULL AND lease_live NOT IN (SELECT key FROM held)
       -- A mark recorded before the server (re)started is gone with every session: its
       -- worker may not have taken it again yet.
       AND lease_live_at > pg_postmaster_start_time()
     ORDER BY priority DESC, id
     LIMIT %(limit)s
), picked AS (
    SELECT j.id FROM herd_jobs j
      JOIN orphans o ON j.id = o.id AND j.lease_token = o.lease_token
     WHERE j.status = 'processing'
     ORDER BY j.id
       FOR UPDATE OF j SKIP LOCKED
)
UPDATE herd_jobs j SET
    lease_token      = j.lease_token + 1,
    stalls           = j.stalls + 1,
    status           = CASE WHEN j.stalls + 1 > j.max_stalls THEN 'dead' ELSE 'processing' END,
    dead_reason      = CASE WHEN j.stalls + 1 > j.max_stalls THEN 'max_stalls' END,
    last_error       = 'worker ' || coalesce(j.lease_owner, '?') || ' died holding the lease',
    finished_at      = CASE WHEN j.stalls + 1 > j.max_stalls THEN now() END,
    lease_owner      = %(owner)s,
    lease_live       = %(live)s,
    lease_live_at    = now(),
    lease_expires_at = now() + j.lease_seconds * interval '1 second',
    last_worker      = %(owner)s
  FROM picked
 WHERE j.id = picked.id
RETURNING j.id AS job_id, j.lease_token AS token, j.task, j.queue, j.payload, j.attempts,
          j.stalls, j.max_attempts, j.lease_seconds, j.lease_expires_at AS expires_at, j.status,
          j.trace_context, j.concurrency_key;

-- name: renew
WITH held AS (
    SELECT j.id FROM herd_jobs j
      JOIN unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS l(id, token)
        ON j.id = l.id AND j.lease_token = l.token
     WHERE j.status = 'processing' AND j.lease_expires_at > now()
     ORDER BY j.id
       FOR UPDATE OF j
)
UPDATE herd_jobs j SET lease_expires_at = now() + j.lease_seconds * interval '1 second'
  FROM held WHERE j.id = held.id
RETURNING j.id, j.lease_expires_at;

-- name: complete
WITH held AS (
    SELECT j.id, l.result FROM herd_jobs j
      JOIN unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(results)s::text[]) AS l(id, token, result)
        ON j.id = l.id AND j.lease_token = l.token
     WHERE j.status = 'processing' AND j.lease_expires_at > now()
     ORDER BY j.id
       FOR UPDATE OF j
)
UPDATE herd_jobs j SET status = 'succeeded', result = held.result::jsonb, finished_at = now(),
                       lease_expires_at = NULL
  FROM held WHERE j.id = held.id
RETURNING j.id;

-- name: complete_and_claim
-- A worker's finished jobs written in the statement of its next claim (one queue's):
-- one commit, so one WAL flush, where a completion and a claim apart cost two; on a
-- disk whose flush takes milliseconds that flush is most of a no-op job's cost. Each
-- row is fenced as in complete above, and `completed` lists those that were; the
-- claim is the statement above, word for word (CLAIM is replaced by it when the
-- broker loads its statements). The two never touch the same row: a completion
-- takes the caller's own jobs whose lease still runs, a claim pending jobs and jobs
-- whose lease expired. One statement, so its triggers fire once, with every row in
-- their transition tables: the counters are upserted once, in their usual order,
-- never first for the completion and then for the claim (two statements of one
-- transaction would lock the counters out of (queue, status) order, and could
-- deadlock with another claimer on the same slot).
-- One row at least: with nothing claimed, a row of NULLs carries `completed`.
WITH held AS (
    SELECT j.id, l.result FROM herd_jobs j
      JOIN unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(results)s::text[]) AS l(id, token, result)
        ON j.id = l.id AND j.lease_token = l.token
     WHERE j.status = 'processing' AND j.lease_expires_at > now()
     ORDER BY j.id
       FOR UPDATE OF j
), completed AS (
    UPDATE herd_jobs j SET status = 'succeeded', result = held.result::jsonb,
                           finished_at = now(), lease_expires_at = NULL
      FROM held WHERE j.id = held.id
    RETURNING j.id
), claimed AS (
CLAIM
)
SELECT (SELECT coalesce(array_agg(id), '{}') FROM completed) AS completed, c.*
  FROM (SELECT 1) one LEFT JOIN claimed c ON true;

-- name: already_completed
-- A completion whose reply was lost (the connection dropped after COMMIT) is retried;
-- finding the job succeeded under the same token means the first attempt landed.
SELECT j.id FROM herd_jobs j
  JOIN unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS l(id, token)
    ON j.id = l.id AND j.lease_token = l.token
 WHERE j.status = 'succeeded';

-- name: fail
UPDATE herd_jobs SET
    attempts         = attempts + 1,
    status           = CASE WHEN %(final)s OR attempts + 1 >= max_attempts THEN 'dead' ELSE 'pending' END,
    dead_reason      = CASE WHEN %(final)s THEN %(reason)s
                            WHEN attempts + 1 >= max_attempts THEN 'max_attempts' END,
    finished_at      = CASE WHEN %(final)s OR attempts + 1 >= max_attempts THEN now() END,
    run_at           = now() + %(retry_in)s * interval '1 second',
    last_error       = %(error)s,
    last_traceback   = %(traceback)s,
    lease_owner      = NULL,
    lease_expires_at = NULL
 WHERE id = %(id)s AND lease_token = %(token)s AND status = 'processing' AND lease_expires_at > now()
RETURNING status, queue;

-- name: release
WITH held AS (
    SELECT j.id FROM herd_jobs j
      JOIN unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS l(id, token)
        ON j.id = l.id AND j.lease_token = l.token
     WHERE j.status = 'processing' AND j.lease_expires_at > now()
     ORDER BY j.id
       FOR UPDATE OF j
)
UPDATE herd_jobs j SET status = 'pending', run_at = now() + %(delay)s * interval '1 second',
       lease_owner = NULL, lease_expires_at = NULL
  FROM held WHERE j.id = held.id
RETURNING j.id, j.queue;

-- name: reschedule
-- Pending jobs only: a running one keeps its lease, a dead one stays in the DLQ.
WITH moved AS (
    SELECT id FROM herd_jobs
     WHERE id = ANY(%(ids)s::bigint[]) AND status = 'pending'
     ORDER BY id
       FOR UPDATE
)
UPDATE herd_jobs j SET run_at = now() + %(delay)s * interval '1 second'
  FROM moved WHERE j.id = moved.id
RETURNING j.id, j.queue;

-- name: check_lease
-- Taken inside a caller's transaction: holds the row until COMMIT, so no
-- takeover can slip between this check and the caller's own writes. The lock
-- also keeps every claim's scan for expired leases off the row: a transaction
-- left idle longer than the lease (its client cut off, frozen or gone without a
-- word reaching the server) is ended by the server, lock and all, so that the job
-- can be taken over; held longer it could not commit its writes under a live
-- lease anyway (the job's renewals wait on the same row).
SELECT set_config('idle_in_transaction_session_timeout', %(idle)s, true) FROM herd_jobs
 WHERE id = %(id)s AND lease_token = %(token)s AND status = 'processing' AND lease_expires_at > now()
   FOR UPDATE;

-- name: get_job
SELECT * FROM herd_jobs WHERE id = %(id)s;

-- name: get_jobs
SELECT * FROM herd_jobs WHERE id = ANY(%(ids)s::bigint[]);

-- name: list_jobs
SELECT * FROM herd_jobs
 WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- name: stats
-- Counts from herd_job_counts (a few rows per queue, kept by 0007's triggers); ready
-- is pending less the jobs whose bucket in herd_job_scheduled (0012) is still in the
-- future, so no pending row is visited to count it. The wait is that of the job
-- next in line (the head of the claim order, along herd_jobs_ready, as a claim
-- reads it), looked up only where some job is ready: one index entry in a backlog.
WITH counts AS (
    SELECT queue, status, sum(n)::bigint AS n FROM herd_job_counts
     GROUP BY queue, status HAVING sum(n) <> 0
), future AS (
    SELECT queue, sum(n)::bigint AS n FROM herd_job_scheduled
     WHERE due > now()
     GROUP BY queue
), pending AS (
    SELECT c.queue, greatest(0, c.n - coalesce(f.n, 0)) AS ready
      FROM counts c LEFT JOIN future f ON f.queue = c.queue
     WHERE c.status = 'pending'
)
SELECT c.queue, c.status, c.n, coalesce(p.ready, 0), h.wait
  FROM counts c
  LEFT JOIN pending p ON p.queue = c.queue AND c.status = 'pending'
  LEFT JOIN LATERAL (
      SELECT extract(epoch FROM now() - j.run_at) AS wait FROM herd_jobs j
       WHERE p.ready > 0 AND j.status = 'pending' AND j.queue = c.queue AND j.run_at <= now()
       ORDER BY j.priority DESC, j.id
       LIMIT 1
  ) h ON true
 ORDER BY c.queue, c.status;

-- name: next_due
-- Only idle workers that stop when idle ask, and only when nothing is ready: the rows
-- it reads are those held for later (retries, parked batches), along herd_jobs_ready.
SELECT extract(epoch FROM min(run_at) - now()) FROM herd_jobs
 WHERE status = 'pending' AND queue = ANY(%(queues)s);

-- name: purge_scheduled
-- Buckets of herd_job_scheduled in the past count nothing any more (the purge tick).
DELETE FROM herd_job_scheduled WHERE due < now() - interval '1 minute';

-- name: key_stats
-- Running and waiting jobs per concurrency key (0011's counters), the busiest first, at
-- a cost of O(active work + limit) whatever the keys with work: a key with a job running
-- is found from the leased jobs (herd_jobs_leased), one with none can rank only by its
-- waiting jobs (herd_key_counts_waiting, 0014), so the two hold the top `limit`.
WITH candidates AS (
    SELECT DISTINCT queue, concurrency_key AS key FROM herd_jobs
     WHERE status = 'processing' AND concurrency_key IS NOT NULL
    UNION
    (SELECT queue, key FROM herd_key_counts WHERE waiting > 0
      ORDER BY waiting DESC LIMIT %(limit)s)
)
SELECT k.queue, k.key, (k.claimed - r.n)::int AS running, k.waiting, k.max_running
  FROM candidates c
  JOIN herd_key_counts k ON k.queue = c.queue AND k.key = c.key
 CROSS JOIN LATERAL (SELECT coalesce(sum(n), 0) AS n FROM herd_key_released r
                      WHERE r.queue = k.queue AND r.key = k.key) r
 WHERE k.claimed > r.n OR k.waiting > 0
 ORDER BY k.claimed - r.n + k.waiting DESC, k.queue, k.key
 LIMIT %(limit)s;

-- name: key_counts_prune
-- Keys with no work left (the purge tick), with their releases: SKIP LOCKED leaves a
-- key a claim or an enqueue holds; the next enqueue of the key makes its row again.
WITH gone AS (
    DELETE FROM herd_key_counts WHERE (queue, key) IN (
        SELECT queue, key FROM herd_key_counts k
         WHERE waiting = 0
           AND claimed = (SELECT coalesce(sum(n), 0) FROM herd_key_released r
                           WHERE r.queue = k.queue AND r.key = k.key)
         LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED)
    RETURNING queue, key
), shards AS (
    DELETE FROM herd_key_released r USING gone
     WHERE r.queue = gone.queue AND r.key = gone.key
)
SELECT key FROM gone;

-- name: counters_to_fold
SELECT DISTINCT queue, status FROM herd_job_counts WHERE slot <> 0 ORDER BY queue, status;

-- name: fold_counts
-- Sums every slot of one counter into slot 0 (the purge tick calls it), in a
-- transaction of its own. One counter at a time: a fold of all of them held every
-- row while its last step inserted the slot-0 rows that were missing, and a claim
-- that had just inserted one of those (and waited on a row the fold held) closed a
-- cycle (a deadlock seen with 20 workers on 16 slots).
WITH locked AS (
    SELECT queue, status, slot FROM herd_job_counts
     WHERE queue = %(queue)s AND status = %(status)s ORDER BY slot FOR UPDATE
), gone AS (
    DELETE FROM herd_job_counts c USING locked l
     WHERE c.queue = l.queue AND c.status = l.status AND c.slot = l.slot AND l.slot <> 0
    RETURNING c.queue, c.status, c.n
)
INSERT INTO herd_job_counts AS c (queue, status, slot, n)
SELECT queue, status, 0, sum(n) FROM gone GROUP BY queue, status ORDER BY queue, status
ON CONFLICT (queue, status, slot) DO UPDATE SET n = c.n + excluded.n;

-- name: requeue_dead
-- A dead job whose dedup key an active job holds stays dead and is reported with
-- that job's id; of dead jobs sharing a free key, the oldest goes back and holds
-- it. One statement: the rest are requeued whatever one conflict says.
WITH dead AS MATERIALIZED (
    SELECT id, queue, dedup_key FROM herd_jobs
     WHERE status = 'dead' AND (%(all)s OR id = ANY(%(ids)s::bigint[]))
     ORDER BY id
       FOR UPDATE
), held AS (
    SELECT d.id, a.id AS held_by FROM dead d
      JOIN herd_jobs a ON a.queue = d.queue AND a.dedup_key = d.dedup_key
     WHERE a.status IN ('pending', 'processing')
), free AS (
    SELECT DISTINCT ON (queue, dedup_key) id, queue, dedup_key FROM dead
     WHERE dedup_key IS NOT NULL AND id NOT IN (SELECT id FROM held)
     ORDER BY queue, dedup_key, id
), go AS (
    SELECT id FROM dead WHERE dedup_key IS NULL
    UNION ALL
    SELECT id FROM free
), moved AS (
    UPDATE herd_jobs j SET status = 'pending', attempts = 0, stalls = 0, run_at = now(),
                           dead_reason = NULL, finished_at = NULL, lease_owner = NULL,
                           lease_expires_at = NULL
      FROM go WHERE j.id = go.id
    RETURNING j.id, j.queue
)
SELECT id, queue, NULL::text AS dedup_key, NULL::bigint AS held_by FROM moved
UNION ALL
SELECT d.id, d.queue, d.dedup_key, coalesce(h.held_by, f.id) FROM dead d
  LEFT JOIN held h ON h.id = d.id
  LEFT JOIN free f ON f.queue = d.queue AND f.dedup_key = d.dedup_key
 WHERE d.id NOT IN (SELECT id FROM go);

-- name: running
-- Walks herd_jobs_leased; lease_left comes from the server clock, so a dashboard
-- counting it down never compares its own clock with the database's.
SELECT id, task, queue, lease_owner AS owner, attempts, lease_seconds, lease_expires_at,
       extract(epoch FROM lease_expires_at - now())::float8 AS lease_left
  FROM herd_jobs
 WHERE status = 'processing'
 ORDER BY lease_expires_at, id
 LIMIT %(limit)s;

-- name: throughput
-- From the per-minute rollup (herd_job_throughput, kept by 0007's triggers), along
-- its primary key: minutes x queues x slots rows, whatever the job history holds.
-- Nothing finished in the window: one row of NULLs.
WITH w AS (SELECT date_trunc('minute', now()) - (%(minutes)s - 1) * interval '1 minute' AS start)
SELECT w.start, t.queue, (extract(epoch FROM t.minute - w.start) / 60)::int AS i, t.status,
       sum(t.n)::bigint
  FROM w LEFT JOIN herd_job_throughput t ON t.minute >= w.start
 GROUP BY w.start, t.queue, i, t.status;

-- name: purge_throughput
DELETE FROM herd_job_throughput WHERE minute < now() - make_interval(secs => %(keep)s);

-- name: purge_finished
-- Succeeded jobs past their retention, one batch, oldest first, along the partial
-- index herd_jobs_finished; SKIP LOCKED lets workers purge side by side.
DELETE FROM herd_jobs WHERE id IN (
    SELECT id FROM herd_jobs
     WHERE status = 'succeeded' AND finished_at < now() - make_interval(secs => %(keep)s)
     ORDER BY finished_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED)
RETURNING id;


-- name: purge_dead
-- Dead-lettered jobs finished before the cutoff, one batch, oldest first, along the
-- partial index herd_jobs_dead.
DELETE FROM herd_jobs WHERE id IN (
    SELECT id FROM herd_jobs
     WHERE status = 'dead' AND finished_at < now() - make_interval(secs => %(keep)s)
       AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
     ORDER BY finished_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED)
RETURNING id;

-- Periodic jobs (herd.schedule). A schedule's tick is a compare-and-set of its
-- last_tick, run in the transaction of the enqueue of its jobs (fire_schedule).

-- name: schedules_save
-- Registered by every worker whose app defines them: a new schedule starts at the
-- tick given (the latest at or before now, so it first runs at the next); a known
-- one keeps its state and takes the definition, written only when it changed.
INSERT INTO herd_schedules (name, task, queue, cron, every, timezone, policy, catch_up,
                            priority, last_tick)
SELECT * FROM unnest(%(name)s::text[], %(task)s::text[], %(queue)s::text[], %(cron)s::text[],
                     %(every)s::float8[], %(timezone)s::text[], %(policy)s::text[],
                     %(catch_up)s::int[], %(priority)s::int[], %(last_tick)s::timestamptz[])
ON CONFLICT (name) DO UPDATE SET
    task = excluded.task, queue = excluded.queue, cron = excluded.cron, every = excluded.every,
    timezone = excluded.timezone, policy = excluded.policy, catch_up = excluded.catch_up,
    priority = excluded.priority, updated_at = now()
 WHERE (herd_schedules.task, herd_schedules.queue, herd_schedules.cron, herd_schedules.every,
        herd_schedules.timezone, herd_schedules.policy, herd_schedules.catch_up,
        herd_schedules.priority)
       IS DISTINCT FROM (excluded.task, excluded.queue, excluded.cron, excluded.every,
                         excluded.timezone, excluded.policy, excluded.catch_up, excluded.priority);

-- name: schedules_list
SELECT name, task, queue, cron, every, timezone, policy, catch_up, priority, paused,
       last_tick, last_job_id, last_run_at, runs
  FROM herd_schedules
 WHERE %(all)s OR name = ANY(%(names)s::text[])
 ORDER BY name;

-- name: schedule_advance
-- The tick's compare-and-set: a second worker's same statement waits on the row lock,
-- then finds last_tick moved and updates nothing.
UPDATE herd_schedules SET last_tick = %(tick)s
 WHERE name = %(name)s AND NOT paused AND last_tick IS NOT DISTINCT FROM %(after)s
RETURNING name;

-- name: schedule_ran
UPDATE herd_schedules SET last_job_id = %(job_id)s, last_run_at = now(), runs = runs + %(n)s
 WHERE name = %(name)s
RETURNING name;

-- name: schedule_remove
DELETE FROM herd_schedules WHERE name = %(name)s
RETURNING name;

-- name: schedule_pause
-- A resume moves last_tick to the floor given (the latest tick): the ticks of the
-- pause are dropped, not back-filled.
UPDATE herd_schedules SET paused = %(paused)s,
       last_tick = CASE WHEN %(floor)s::timestamptz IS NULL THEN last_tick
                        ELSE greatest(last_tick, %(floor)s::timestamptz) END,
       updated_at = now()
 WHERE name = %(name)s
RETURNING name;
