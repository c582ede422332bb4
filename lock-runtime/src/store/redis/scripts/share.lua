-- Take a share of a read-write lock: any number of shared holders (readers) at once, none while
-- an exclusive holder (a writer) has the key, and no new one while a writer waits for the
-- readers to leave (writers are not starved by a stream of readers). Idempotent for one token.
-- The readers' hash at the lock key: field 'mode' = 'read', and one field per reader, its token,
-- valued with the server time in ms at which its share expires; the key's own expiry is the
-- latest of them, so the hash goes when its last share does. A writer holds the key as a string
-- (acquire.lua), so the two exclude each other on one key.
-- KEYS[1] lock key, KEYS[2] waiting writers (tokens by the ms their claim lapses: acquire.lua),
-- KEYS[3] fence counter (with fencing only: a reader reads the last writer's token), then the
-- lock's waiting mark when the caller will wait (not on a Redis Cluster: see acquire.lua).
-- ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] '1' = fencing, ARGV[4] where in KEYS the waiting
-- mark is ('': not given).
-- Returns {1, fence} when shared (fence 0 without fencing), or {0, ms}: how long to wait before
-- asking again unless woken (the writer's remaining ttl, or until the waiting writers' claim
-- lapses), -1 for a foreign value without expiry; {2, count} when the key is a semaphore's.
local fence = 0
if ARGV[3] == '1' then
  local counter = redis.call('GET', KEYS[3])
  if counter and not string.match(counter, '^%d+$') then
    return redis.error_reply('fence counter ' .. KEYS[3] .. ' does not hold a non-negative integer')
  end
  fence = tonumber(counter) or 0
end
local mark = KEYS[tonumber(ARGV[4]) or 0]

-- Refused: a caller that will wait marks the lock as waited for (as in acquire.lua).
local function refused(ms)
  if mark and ms > 0 then
    redis.call('SET', mark, '1', 'PX', ms + 1000)
  end
  return {0, ms}
end

local ttl = tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local kind = redis.call('TYPE', KEYS[1]).ok
local mode = kind == 'hash' and redis.call('HGET', KEYS[1], 'mode')
if mode == 'permits' then
  -- A semaphore's (permit.lua): held with another count than a read-write lock's.
  return {2, tonumber(redis.call('HGET', KEYS[1], 'permits')) or 0}
end
local readers = mode == 'read'
if kind ~= 'none' and not readers then
  -- A writer, or a value this library did not write.
  return refused(redis.call('PTTL', KEYS[1]))
end
local mine = readers and tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
if not (mine and mine > now) then
  -- A new share: not while a writer waits.
  local claim = redis.call('ZRANGE', KEYS[2], '+inf', now, 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')[2]
  if claim then
    -- With no lock at the key there is no release to mark yet (a mark is only ever beside a
    -- lock, whose release deletes it): the writer marks the lock when it takes it (acquire.lua).
    if kind == 'none' then
      return {0, tonumber(claim) - now}
    end
    return refused(tonumber(claim) - now)
  end
end
redis.call('HSET', KEYS[1], 'mode', 'read', ARGV[1], now + ttl)
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {1, fence}
