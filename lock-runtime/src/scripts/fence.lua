-- Shared by acquire.lua and release.lua (prepended to each): the next fencing token of counter
-- `key`, whose value `counter` (nil when it does not exist) was read and found a non-negative
-- integer. The token is above the last one and at least the server's clock in microseconds, so
-- a counter lost with its data (a restart without persistence, a failover to a replica that
-- missed the last INCRBY) restarts above every token it handed out, as long as the clock has not
-- gone back by more than the time since then.
local function next_fence(key, counter)
  local time = redis.call('TIME')
  local floor = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local last = tonumber(counter) or 0
  local step = 1
  if floor > last + 1 then
    step = floor - last
  end
  return redis.call('INCRBY', key, step)
end

