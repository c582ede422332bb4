-- Extend a lock we still hold. Never re-creates a missing key.
-- KEYS[1] lock key; ARGV[1] our token, ARGV[2] new ttl in ms.
-- Returns 1 when renewed, 0 when the key is gone or holds something else (a key of another type
-- answers GET with an error: not ours either).
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
