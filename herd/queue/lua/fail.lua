-- ARGV: prefix, id, token, final 0/1, reason, retry_ms, error, traceback.
-- Returns the new status, or false when the lease is no longer held.
local id, token, final, reason = ARGV[2], ARGV[3], ARGV[4] == '1', ARGV[5]
local retry_ms = tonumber(ARGV[6])
if not held(id, token) then return false end
local now = now_ms()
local job = jkey(id)
local attempts = redis.call('HINCRBY', job, 'attempts', 1)
redis.call('HSET', job, 'last_error', ARGV[7], 'last_traceback', ARGV[8])
if final or attempts >= tonumber(redis.call('HGET', job, 'max_attempts')) then
  dead(id, 'processing', final and reason or 'max_attempts', now)
  return 'dead'
end
requeue(id, 'processing', retry_ms, now)
return 'pending'
