-- Take a lock if its key is free. Idempotent for one token: a request sent again after its
-- connection broke finds the lock already its own and takes neither a second lock nor a second
-- fencing token.
-- KEYS[1] lock key, KEYS[2] fence counter; ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] '1' = fencing.
-- Returns {1, fence} when taken (fence is 0 without fencing), or {0, pttl} when the key is held
-- by anything else (pttl is -1 for a key without expiry, such as a foreign value).
-- Every check comes before the first write: a counter of another type (WRONGTYPE), or one that is
-- not a non-negative integer, fails the script with nothing changed.
local fencing = ARGV[3] == '1'
local counter
if fencing then
  counter = redis.call('GET', KEYS[2])
  if counter and not string.match(counter, '^%d+$') then
    return redis.error_reply('fence counter ' .. KEYS[2] .. ' does not hold a non-negative integer')
  end
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if not fencing then
    return {1, 0}
  end
  -- The next token is above the last one and at least the server's clock in microseconds, so a
  -- counter lost with its data (a restart without persistence, a failover to a replica that
  -- missed the last INCRBY) restarts above every token it handed out, as long as the clock has
  -- not gone back by more than the time since then.
  local time = redis.call('TIME')
  local floor = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local last = tonumber(counter) or 0
  local step = 1
  if floor > last + 1 then
    step = floor - last
  end
  return {1, redis.call('INCRBY', KEYS[2], step)}
end
-- A foreign value of another type answers GET with an error: not ours either.
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return {1, tonumber(counter) or 0}
end
return {0, redis.call('PTTL', KEYS[1])}
