-- Shared by acquire.lua, fair.lua, permit.lua, set.lua and release.lua (prepended to each):
-- fencing tokens, the check of a helper key's type, and a waiter's place in a fair line.

-- Whether `counter` (a fencing counter's value as GET read it; nil when it does not exist) is one
-- this library can take a token from: a non-negative integer that Lua's numbers hold exactly
-- (below 2^53: INCRBY could overflow past 2^63, and a script that fails there after setting the
-- lock would leave it set with no token given back). Checked before any write.
local function fence_ok(counter)
  if counter == nil or counter == false then
    return true
  end
  return type(counter) == 'string' and string.match(counter, '^%d+$') ~= nil and #counter <= 16
    and tonumber(counter) < 9007199254740992 - 1000000000000
end

-- Whether `key` is free or holds a value of `kind` (a sorted set for the fair line and the
-- waiting writers): a helper key of another type would fail a write in the middle of a script.
local function kind_ok(key, kind)
  local t = redis.call('TYPE', key).ok
  return t == 'none' or t == kind
end

-- The next fencing token of counter `key`, whose value `counter` passed fence_ok. The token is
-- above the last one and at least the server's clock in microseconds, so a counter lost with its
-- data (a restart without persistence, a failover to a replica that missed the last INCRBY) or
-- expired restarts above every token it handed out, as long as the clock has not gone back by
-- more than the time since then. The counter expires `keep_ms` after its last token (an hour,
-- or the lease if longer): a service locking a million ids a day does not keep a million
-- counters.
local function next_fence(key, counter, keep_ms)
  local time = redis.call('TIME')
  local floor = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local last = tonumber(counter) or 0
  local step = 1
  if floor > last + 1 then
    step = floor - last
  end
  local fence = redis.call('INCRBY', key, step)
  redis.call('PEXPIRE', key, math.max(3600000, tonumber(keep_ms) or 0) + 1000)
  return fence
end

-- Puts `token` at the end of fair line `line` (unless it is in it), at the server's clock
-- `time` (TIME's answer) in microseconds, or just above the last waiter's score when that is
-- later (two arrivals in one microsecond, a clock gone back): scores never tie, so the line's
-- order is its order of arrival, not the tokens'.
local function join_line(line, token, time)
  local last = redis.call('ZRANGE', line, -1, -1, 'WITHSCORES')[2]
  local score = math.max(tonumber(time[1]) * 1000000 + tonumber(time[2]), (tonumber(last) or 0) + 1)
  redis.call('ZADD', line, 'NX', string.format('%d', score), token)
end
