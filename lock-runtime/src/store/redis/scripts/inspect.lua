-- One lock as it is now, read at one instant (a lock is never seen free by one read and held
-- by the next), for holder(), is_locked() and operators (lock_runtime::admin, lockctl).
-- KEYS[1] the lock, KEYS[2] its fencing counter, KEYS[3] its fair places (by when they lapse),
-- KEYS[4] its waiting writers' claims (by when they lapse).
-- Returns {type, value, pttl, fence state, fence, fair places, writers, now in ms}: the lock
-- key's Redis type; for a string its value, for a hash its fields and values (a read-write lock's
-- readers, each share's expiry in ms by this server's clock), else nil; its PTTL; the counter's
-- state (0 none, 1 a string, 2 something else) and value; how many fair places and writers'
-- claims have not lapsed; and the server's clock in ms. Reads only, with commands the locking
-- rights already have (no ZCOUNT, no MULTI).
local kind = redis.call('TYPE', KEYS[1]).ok
local value = false
if kind == 'string' then
  value = redis.call('GET', KEYS[1])
elseif kind == 'hash' then
  value = redis.call('HGETALL', KEYS[1])
end
local pttl = redis.call('PTTL', KEYS[1])
local fence, fence_state = redis.pcall('GET', KEYS[2]), 1
if type(fence) == 'table' and fence.err then
  fence, fence_state = false, 2
elseif not fence then
  fence_state = 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local function live(key)
  local members = redis.pcall('ZRANGEBYSCORE', key, '(' .. now, '+inf')
  if type(members) == 'table' and members.err then
    return 0
  end
  return #members
end
return {kind, value, pttl, fence_state, fence, live(KEYS[3]), live(KEYS[4]), now}
