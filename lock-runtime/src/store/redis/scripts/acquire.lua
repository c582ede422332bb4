-- Take an exclusive lock that is not fair, if its key is free (fair.lua takes fair ones).
-- Idempotent for one token: a request sent again after its connection broke finds the lock
-- already its own and takes neither a second lock nor a second fencing token.
-- KEYS[1] the lock; KEYS[2] its fencing counter, with fencing; the waiting writers and the
-- waiting mark where ARGV says. Only the keys the attempt uses are named: while a Redis Cluster
-- slot migrates, a script naming a key that does not exist is refused with TRYAGAIN.
-- ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] '1' = fencing, ARGV[4] where in KEYS the waiting
-- writers are ('' = not given: the caller will not wait), ARGV[5] the ms a waiting writer's
-- claim is kept without a new attempt, ARGV[6] '1' = the caller claimed before (its claim goes
-- when it takes the lock), ARGV[7] where in KEYS the lock's waiting mark is ('' = not given: the
-- caller will not wait, or a Redis Cluster, where every release announces). A refusal sets the
-- mark, so that the holder's release is announced (unlock.lua, release.lua).
-- Returns {1, fence} when taken (fence is 0 without fencing), or {0, pttl} when not: pttl is the
-- holder's remaining ttl, -1 for a key without expiry (a foreign value); a refusal by readers
-- that claimed the writers' turn adds two elements, 0 and 1; {2, count} when the key is a
-- semaphore's (permit.lua) with `count` permits.
-- Every check comes before the first write: a counter of another type (WRONGTYPE), or one that is
-- not a non-negative integer below 2^53, or a helper key of another type, fails the script with
-- nothing changed.
local lock, token, ttl = KEYS[1], ARGV[1], ARGV[2]
local fence = ARGV[3] == '1' and KEYS[2] or nil
local writers = KEYS[tonumber(ARGV[4]) or 0]
local claimed = ARGV[6] == '1'
local mark = KEYS[tonumber(ARGV[7]) or 0]
local counter, failed = checked(fence, writers, claimed)
if failed then
  return failed
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

if redis.call('SET', lock, token, 'NX', 'PX', ttl) then
  unclaim(writers, claimed, token, mark, ttl)
  return taken(fence, counter, ttl)
end
-- A foreign value of another type answers GET with an error: not ours either.
local held = redis.pcall('GET', lock)
if held == token then
  return already_ours(lock, ttl, fence, counter)
end
local shared = writers and readers(lock, held)
if shared == 'free' and redis.call('SET', lock, token, 'NX', 'PX', ttl) then
  unclaim(writers, claimed, token, mark, ttl)
  return taken(fence, counter, ttl)
end
local count = semaphore(lock, held)
if count then
  return {2, count}
end
if shared == 'readers' then
  claim(writers, token, ARGV[5])
  return refused({0, redis.call('PTTL', lock), 0, 1})
end
return refused({0, redis.call('PTTL', lock)})
