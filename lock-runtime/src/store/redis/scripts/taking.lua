-- Shared by acquire.lua and fair.lua (prepended to each, after fence.lua): taking a lock, and the
-- writer's side of a read-write lock.
-- Read-write locks: readers share the lock key as a hash (share.lua). A waiting writer refused by
-- readers claims its turn in the waiting writers (tokens by the ms their claim lapses): no new
-- reader enters while a claim stands, so the readers drain and the writer gets in. A writer
-- that died or gave up holds readers back for at most its claim's life.

-- The checks an attempt makes before its first write, so that a failing one changes nothing:
-- the fencing counter `fence` (given with fencing) must hold a token this library can raise
-- (fence_ok), and the waiting writers' key of a caller that `claimed` before (it removes its
-- claim once it has set the lock) must be a sorted set. Returns the counter's value (false:
-- none yet; nil: no fencing), or nil and the error reply to fail the script with.
local function checked(fence, writers, claimed)
  local counter = nil
  if fence then
    counter = redis.call('GET', fence)
    if not fence_ok(counter) then
      return nil, redis.error_reply('fence counter ' .. fence .. ' does not hold a non-negative integer below 2^53')
    end
  end
  if writers and claimed and not kind_ok(writers, 'zset') then
    return nil, redis.error_reply('WRONGTYPE ' .. writers .. ' is not a sorted set (a lock helper key)')
  end
  return counter
end

-- The server's clock in ms.
local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- The lock was just set: {1, the new fencing token}, when `fence` (the counter's key, whose
-- value `counter` passed fence_ok) is given, else {1, 0}.
local function taken(fence, counter, ttl)
  if not fence then
    return {1, 0}
  end
  return {1, next_fence(fence, counter, ttl)}
end

-- The lock is already the caller's: a request sent again after its connection broke (its token
-- was taken then), or a fair waiter's turn handed to it by a release while no counter existed
-- (no token yet: it takes one now). Its expiry counts from this attempt, and the write gives a
-- WAIT behind it something to wait for.
local function already_ours(lock, ttl, fence, counter)
  redis.call('PEXPIRE', lock, ttl)
  if fence and not counter then
    return taken(fence, counter, ttl)
  end
  return {1, tonumber(counter) or 0}
end

-- The count of the semaphore at `lock` (permit.lua), when GET answered `held` there with an
-- error (a hash) and the hash is a semaphore's: a lock asked of it is refused with {2, count}.
local function semaphore(lock, held)
  if type(held) ~= 'table' or redis.call('TYPE', lock).ok ~= 'hash' then
    return nil
  end
  if redis.call('HGET', lock, 'mode') ~= 'permits' then
    return nil
  end
  return tonumber(redis.call('HGET', lock, 'permits')) or 0
end

-- What GET answered `held` at `lock` means for a writer: 'readers' when readers share the lock
-- (their hash answers GET with an error), 'free' when that hash holds no live share any more
-- (its readers died after a longer lease; it is deleted here, so their lease ends for writers
-- when theirs would), nil for anything else.
local function readers(lock, held)
  if type(held) ~= 'table' or redis.call('TYPE', lock).ok ~= 'hash' then
    return nil
  end
  local now = now_ms()
  local fields = redis.call('HGETALL', lock)
  local mode, live = nil, false
  for i = 1, #fields, 2 do
    if fields[i] == 'mode' then
      mode = fields[i + 1]
    elseif (tonumber(fields[i + 1]) or 0) > now then
      live = true
    end
  end
  if mode ~= 'read' then
    return nil
  end
  if not live then
    redis.call('DEL', lock)
    return 'free'
  end
  return 'readers'
end

-- Refused while readers share the lock: a waiting writer claims its turn in `writers` for
-- `kept` ms.
local function claim(writers, token, kept)
  kept = tonumber(kept)
  redis.call('ZADD', writers, now_ms() + kept, token)
  redis.call('PEXPIRE', writers, kept)
end

-- Taking the lock ends the caller's claim as a waiting writer (`claimed`: it made one). Readers
-- the claim held back while no lock was at the key wait for this lock, unmarked (share.lua): it
-- is marked as waited for (`mark`, when the deployment marks), so that its release announces
-- itself.
local function unclaim(writers, claimed, token, mark, ttl)
  if writers and claimed then
    redis.call('ZREM', writers, token)
    if mark then
      redis.call('SET', mark, '1', 'PX', tonumber(ttl) + 1000)
    end
  end
end
