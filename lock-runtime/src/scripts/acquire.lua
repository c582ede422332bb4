-- Take a lock if its key is free.
-- KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] '1' = fencing.
-- Returns {1, fence} when taken (fence is 0 without fencing), or {0, pttl} when the key is held
-- by anything at all (pttl is -1 for a key without expiry, such as a foreign value).
-- Every check comes before the first write: a counter of another type (WRONGTYPE), or one that is
-- not a non-negative integer, fails the script with nothing changed.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('PTTL', KEYS[1])}
end
local fence = 0
if ARGV[3] == '1' then
  local current = redis.call('GET', KEYS[2])
  if current and not string.match(current, '^%d+$') then
    return redis.error_reply('fence counter ' .. KEYS[2] .. ' does not hold a non-negative integer')
  end
  fence = redis.call('INCR', KEYS[2])
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, fence}
