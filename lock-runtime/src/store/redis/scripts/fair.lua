-- Take a fair lock: it goes to the head of its line, and a refused caller that will wait takes
-- a place in the line (acquire.lua takes locks that are not fair). Idempotent for one token, as
-- acquire.lua.
-- KEYS[1] the lock, KEYS[2] its fencing counter (read with fencing only), KEYS[3] the line
-- (waiter tokens by arrival), KEYS[4] the places (waiter tokens by the ms their place lapses),
-- KEYS[5] the waiting writers, when the caller will wait. (No waiting mark: a fair release
-- always announces, naming the next in line.)
-- ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] '1' = fencing, ARGV[4] the ms a waiter's place is
-- kept without a new attempt, ARGV[5] '1' = join the line (the caller will wait), ARGV[6] the
-- lock's wake-up channel (an argument, not a key: see acquire.lua), ARGV[7] '1' = a Redis
-- Cluster: announce with sharded pub/sub (SPUBLISH), ARGV[8] the ms a waiting writer's claim is
-- kept, ARGV[9] '1' = the caller claimed before.
-- Returns {1, fence} when taken (fence is 0 without fencing), or {0, pttl, ahead, claimed,
-- kept}: pttl the holder's remaining ttl (-2 when the key is free but waiters come first, -1 a
-- foreign value without expiry), ahead how many waiters are ahead in line, claimed 1 when
-- readers refused it and it claimed the writers' turn, and kept the server ms until which its
-- place is kept (0: it took none): a release that hands the lock over names it (release.lua),
-- so the waiter knows which of its attempts the lease counts from. {2, count} when a semaphore
-- holds the key (count its permits).
-- Every check comes before the first write, as in acquire.lua (the line is read before it is
-- written, so a line of another type fails the script with nothing changed).
local lock, token, ttl = KEYS[1], ARGV[1], ARGV[2]
local line, places, writers = KEYS[3], KEYS[4], KEYS[5]
local fence = ARGV[3] == '1' and KEYS[2] or nil
local claimed = ARGV[9] == '1'
local counter, failed = checked(fence, writers, claimed)
if failed then
  return failed
end

-- Waiters whose place lapsed (they stopped asking: dead, or gone without leaving) lose it first.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local lapsed = redis.call('ZRANGEBYSCORE', places, '-inf', now)
for _, waiter in ipairs(lapsed) do
  redis.call('ZREM', line, waiter)
  redis.call('ZREM', places, waiter)
end
local holder = redis.pcall('GET', lock)
-- A semaphore's key: refused with its count, before the caller joins a line.
local count = semaphore(lock, holder)
if count then
  return {2, count}
end
if holder == token then
  return already_ours(lock, ttl, fence, counter)
end
local shared = writers and readers(lock, holder)
if shared == 'free' then
  holder = false
end
local head = redis.call('ZRANGE', line, 0, 0)[1]
if holder == false and (head == nil or head == token) then
  if head then
    redis.call('ZREM', line, token)
    redis.call('ZREM', places, token)
  end
  redis.call('SET', lock, token, 'PX', ttl)
  unclaim(writers, claimed, token, nil, ttl)
  return taken(fence, counter, ttl)
end
local kept = 0
if ARGV[5] == '1' then
  local place = tonumber(ARGV[4])
  kept = now + place
  join_line(line, token, time)
  redis.call('ZADD', places, kept, token)
  -- The line lives while someone asks (each within its place's life): once its last waiter died,
  -- it goes a second after that waiter's place lapsed.
  redis.call('PEXPIRE', line, place + 1000)
  redis.call('PEXPIRE', places, place + 1000)
end
if holder == false and #lapsed > 0 then
  -- The lock is free and the waiters ahead of the new head are gone: its turn has come.
  redis.pcall(ARGV[7] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[6], 'w:' .. head)
end
-- How many are ahead of the caller in line: a waiter with others ahead will not be named by the
-- next release, so it need not ask again before it sleeps.
local ahead = redis.call('ZRANK', line, token) or 0
local claimed_now = 0
if shared == 'readers' then
  claim(writers, token, ARGV[8])
  claimed_now = 1
end
return {0, redis.call('PTTL', lock), ahead, claimed_now, kept}
