-- Take a lock if its key is free. Idempotent for one token: a request sent again after its
-- connection broke finds the lock already its own and takes neither a second lock nor a second
-- fencing token.
-- KEYS[1] lock key, KEYS[2] fence counter (given with fencing, and in its place with fair, where
-- it is only read with fencing), KEYS[3] fair queue (waiter tokens by arrival), KEYS[4] fair
-- places (waiter tokens by the ms their place lapses); a non-fair acquire names only the keys it
-- uses (while a Redis Cluster slot migrates, a script naming a key that does not exist is
-- refused with TRYAGAIN until the migration ends).
-- ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] '1' = fencing, ARGV[4] fair: '' = not fair, else
-- the ms a waiter's place is kept without a new attempt, ARGV[5] '1' = join the fair queue (the
-- caller will wait), ARGV[6] the lock's wake-up channel (an argument, not a key, for the same
-- reason), ARGV[7] '1' = a Redis Cluster: announce with sharded pub/sub (SPUBLISH), ARGV[8] where
-- in KEYS the waiting writers of a read-write lock are ('' = not given: the caller will not wait),
-- ARGV[9] the ms a waiting writer's claim is kept without a new attempt, ARGV[10] '1' = the
-- caller claimed before (its claim goes when it takes the lock). When the caller will wait and is
-- not fair, the lock's waiting mark may follow the waiting writers in KEYS (not on a Redis
-- Cluster): a refusal sets it, so that the holder's release is announced (release.lua).
-- Read-write locks: readers share the lock key as a hash (share.lua). A waiting writer refused by
-- readers claims its turn in the waiting writers (tokens by the ms their claim lapses): no new
-- reader enters while a claim stands, so the readers drain and the writer gets in. A writer
-- that died or gave up holds readers back for at most its claim's life.
-- Returns {1, fence} when taken (fence is 0 without fencing), or {0, pttl} when not: pttl is the
-- holder's remaining ttl, -1 for a key without expiry (a foreign value), -2 when the key is free
-- but fair waiters come first; a fair refusal adds how many waiters are ahead in line; a
-- refusal by readers that claimed the writers' turn adds a fourth element, 1 (0 otherwise, on a
-- fair refusal); a fair refusal that kept the caller's place adds a fifth, the server ms until
-- which it is kept: a release that hands the lock over names it (release.lua), so the waiter
-- knows which of its attempts the lease counts from.
-- Every check comes before the first write: a counter of another type (WRONGTYPE), or one that is
-- not a non-negative integer below 2^53, or a helper key of another type, fails the script with
-- nothing changed.
local fencing = ARGV[3] == '1'
local counter
if fencing then
  counter = redis.call('GET', KEYS[2])
  if not fence_ok(counter) then
    return redis.error_reply('fence counter ' .. KEYS[2] .. ' does not hold a non-negative integer below 2^53')
  end
end
local writers = KEYS[tonumber(ARGV[8]) or 0]
local mark = writers and KEYS[tonumber(ARGV[8]) + 1]
-- A caller that claimed the writers' turn removes its claim after it set the lock (unclaim):
-- the writers' key is checked first. (The fair line needs no check: the fair path reads both of
-- its keys before its first write, so a key of another type fails it with nothing changed.)
if writers and ARGV[10] == '1' and not kind_ok(writers, 'zset') then
  return redis.error_reply('WRONGTYPE ' .. writers .. ' is not a sorted set (a lock helper key)')
end

-- The lock was just set: the new fencing token, if asked for (fence.lua).
local function taken()
  if not fencing then
    return {1, 0}
  end
  return {1, next_fence(KEYS[2], counter, ARGV[2])}
end

-- The lock is already the caller's: a request sent again after its connection broke (its token
-- was taken then), or a fair waiter's turn handed to it by a release while no counter existed
-- (no token yet: it takes one now). Its expiry counts from this attempt, and the write gives a
-- WAIT behind it something to wait for.
local function already_ours()
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if fencing and not counter then
    return taken()
  end
  return {1, tonumber(counter) or 0}
end


-- Refused: a caller that will wait marks the lock as waited for, until a second after the
-- holder's expiry (the caller asks again by then, and marks it again if still refused). Not a
-- key without expiry (a foreign value: no release of ours will come).
local function refused(answer)
  if mark and answer[2] > 0 then
    redis.call('SET', mark, '1', 'PX', answer[2] + 1000)
  end
  return answer
end

-- Taking the lock ends the caller's claim as a waiting writer. Readers the claim held back
-- while no lock was at the key wait for this lock, unmarked (share.lua): it is marked as waited
-- for, so that its release announces itself.
local function unclaim()
  if writers and ARGV[10] == '1' then
    redis.call('ZREM', writers, ARGV[1])
    if mark then
      redis.call('SET', mark, '1', 'PX', tonumber(ARGV[2]) + 1000)
    end
  end
end

-- What GET answered `held` means for a writer: 'readers' when readers share the lock (their
-- hash answers GET with an error), 'free' when that hash holds no live share any more (its
-- readers died after a longer lease; it is deleted here, so their lease ends for writers when
-- theirs would), nil for anything else.
local function readers(held)
  if type(held) ~= 'table' or redis.call('TYPE', KEYS[1]).ok ~= 'hash' then
    return nil
  end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local fields = redis.call('HGETALL', KEYS[1])
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
    redis.call('DEL', KEYS[1])
    return 'free'
  end
  return 'readers'
end

-- Refused while readers share the lock: a waiting writer claims its turn.
local function claim()
  if not writers or ARGV[5] ~= '1' then
    return false
  end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local kept = tonumber(ARGV[9])
  redis.call('ZADD', writers, now + kept, ARGV[1])
  redis.call('PEXPIRE', writers, kept)
  return true
end

local place = tonumber(ARGV[4])
if not place then
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    unclaim()
    return taken()
  end
  -- A foreign value of another type answers GET with an error: not ours either.
  local held = redis.pcall('GET', KEYS[1])
  if held == ARGV[1] then
    return already_ours()
  end
  local shared = writers and readers(held)
  if shared == 'free' and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    unclaim()
    return taken()
  end
  if shared == 'readers' and claim() then
    return refused({0, redis.call('PTTL', KEYS[1]), 0, 1})
  end
  return refused({0, redis.call('PTTL', KEYS[1])})
end

-- Fair: the lock goes to the head of the queue. Waiters whose place lapsed (they stopped asking:
-- dead, or gone without leaving) lose it first.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
for _, waiter in ipairs(lapsed) do
  redis.call('ZREM', KEYS[3], waiter)
  redis.call('ZREM', KEYS[4], waiter)
end
local holder = redis.pcall('GET', KEYS[1])
if holder == ARGV[1] then
  return already_ours()
end
local shared = writers and readers(holder)
if shared == 'free' then
  holder = false
end
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
if holder == false and (head == nil or head == ARGV[1]) then
  if head then
    redis.call('ZREM', KEYS[3], ARGV[1])
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  unclaim()
  return taken()
end
local kept = 0
if ARGV[5] == '1' then
  kept = now + place
  redis.call('ZADD', KEYS[3], 'NX', tonumber(time[1]) * 1000000 + tonumber(time[2]), ARGV[1])
  redis.call('ZADD', KEYS[4], kept, ARGV[1])
  -- The line lives while someone asks (each within its place's life): once its last waiter died,
  -- it goes a second after that waiter's place lapsed.
  redis.call('PEXPIRE', KEYS[3], place + 1000)
  redis.call('PEXPIRE', KEYS[4], place + 1000)
end
if holder == false and #lapsed > 0 then
  -- The lock is free and the waiters ahead of the new head are gone: its turn has come.
  redis.pcall(ARGV[7] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[6], 'w:' .. head)
end
-- How many are ahead of the caller in line: a waiter with others ahead will not be named by the
-- next release, so it need not ask again before it sleeps.
local ahead = redis.call('ZRANK', KEYS[3], ARGV[1]) or 0
local claimed = 0
if shared == 'readers' and claim() then
  claimed = 1
end
-- (No waiting mark: a fair release always announces, naming the next in line.)
return {0, redis.call('PTTL', KEYS[1]), ahead, claimed, kept}
