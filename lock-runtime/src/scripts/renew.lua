-- Extend locks we still hold, one or many (the watchdog renews a whole batch in one call).
-- Never re-creates a missing key.
-- KEYS[i] the i-th lock key; ARGV[2i-1] its token, ARGV[2i] its new ttl in ms.
-- Returns, per lock, 1 when renewed, 0 when the key is gone or holds something else (a key of
-- another type answers GET with an error: not ours either).
local renewed = {}
for i, key in ipairs(KEYS) do
  if redis.pcall('GET', key) == ARGV[2 * i - 1] then
    renewed[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  else
    renewed[i] = 0
  end
end
return renewed
