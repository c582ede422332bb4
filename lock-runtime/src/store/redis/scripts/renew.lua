-- Extend locks we still hold, one or many (the watchdog renews a whole batch in one call).
-- Never re-creates a missing key, and never shortens a lease: a renewal applied late (re-sent
-- on a new connection) or an extend shorter than the last one leaves the later expiry standing,
-- so the holder's validity (the longest it was told of) is never past the server's.
-- KEYS[i] the i-th lock key; ARGV[2i-1] its token, ARGV[2i] its new ttl in ms.
-- A lock is ours when its key holds our token, or when it is a read-write lock's readers' hash
-- (share.lua) or a semaphore's holders' hash (permit.lua) holding an unexpired share or permit
-- of ours: it gets the new ttl (its value starts with the ms its lease ends), and the hash's own
-- expiry is moved out to cover it.
-- Returns, per lock, 1 when renewed, 0 when the key is gone or holds something else (a key of
-- another type answers GET with an error: not ours either).
local renewed = {}
local now
for i, key in ipairs(KEYS) do
  local token, ttl = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  local held = redis.pcall('GET', key)
  renewed[i] = 0
  if held == token then
    -- GT: 0 when the expiry already stands later, which is still ours and still renewed.
    redis.call('PEXPIRE', key, ttl, 'GT')
    renewed[i] = 1
  elseif type(held) == 'table' and held.err then
    local share = redis.pcall('HGET', key, token)
    if type(share) == 'string' then
      if not now then
        local time = redis.call('TIME')
        now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
      end
      local ends, rest = string.match(share, '^(%d+)(.*)$')
      local mode = redis.call('HGET', key, 'mode')
      if (tonumber(ends) or 0) > now and (mode == 'read' or mode == 'permits') then
        if now + ttl > tonumber(ends) then
          redis.call('HSET', key, token, string.format('%d', now + ttl) .. rest)
        end
        if redis.call('PTTL', key) < ttl then
          redis.call('PEXPIRE', key, ttl)
        end
        renewed[i] = 1
      end
    end
  end
end
return renewed
