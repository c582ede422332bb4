-- The common release: gives a lock back if it is still ours, and announces it if someone waits.
-- For a lock that is not fair and has no minimum hold left; every other release, and whatever
-- this one cannot decide, is release.lua's (a fair hand-over, a minimum hold, a read share).
-- KEYS[1] lock key, KEYS[2] its waiting mark (see release.lua; not given on a Redis Cluster,
-- where every release announces). ARGV[1] our token, ARGV[2] the announcement ('c:' and the
-- releasing client's id: that client wakes its own next waiter itself), ARGV[3] '1' = a Redis
-- Cluster: announce with sharded pub/sub (SPUBLISH). The lock's wake-up channel is its key's
-- name with ':released' (a channel, not a key: on a Cluster it hashes to the lock's slot).
-- Returns 1 when it was ours, 0 when it had expired or been taken by someone else, 2 when it was
-- ours but Redis refused the announcement (see release.lua), and -1 when release.lua must
-- decide: the key holds another type (maybe a read-write lock's readers, with a share of ours)
-- or our token marked released (kept for a minimum hold by an earlier release).
local held = redis.pcall('GET', KEYS[1])
if held ~= ARGV[1] then
  if type(held) == 'table' or held == ARGV[1] .. ':released' then
    return -1
  end
  return 0
end
if KEYS[2] then
  if redis.call('DEL', KEYS[1], KEYS[2]) == 1 then
    -- No mark beside it: nobody waits.
    return 1
  end
else
  redis.call('DEL', KEYS[1])
end
local told = redis.pcall(ARGV[3] == '1' and 'SPUBLISH' or 'PUBLISH', KEYS[1] .. ':released', ARGV[2])
if type(told) == 'table' and told.err then
  return 2
end
return 1
