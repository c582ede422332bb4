-- Take a permit of a semaphore: up to n holders of one key at once, each with its own token,
-- lease and permit number (0..n-1), in one call whatever n is. Idempotent for one token.
-- The holders' hash at the lock key: field 'mode' = 'permits', field 'permits' = n (the count
-- is stored with the key: an acquire asking another is refused), and one field per holder, its
-- token, valued '<ms its lease ends by the server's clock>:<permit>:<fencing token, 0 without>'.
-- A permit given back and kept for its minimum hold is a field '<token>:released' (release.lua).
-- The key's own expiry is the latest lease, so the hash goes when its last holder's does; a
-- holder that stopped renewing (crashed) lapses at its own lease, and its permit is free then.
-- A fair semaphore orders its waiters in a line of its own (as fair.lua's: tokens by arrival,
-- and by when each one's place lapses unless it asks again): a caller takes a permit only while fewer
-- waiters are ahead of it in line than permits are free, and a refused caller that will wait
-- takes (or keeps) its place.
-- KEYS[1] the lock, KEYS[2] its fencing counter (with fencing), then the lock's waiting mark
-- when the caller will wait (not on a Redis Cluster, where every release announces), then, for
-- a fair semaphore, its line and places.
-- ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] '1' = fencing, ARGV[4] n, ARGV[5] where in KEYS the
-- waiting mark is ('': not given), ARGV[6] where in KEYS the line is ('': not fair), ARGV[7]
-- the ms a waiter's place is kept without a new attempt, ARGV[8] '1' = join the line.
-- Returns {1, fence, permit} when taken (fence 0 without fencing), {0, ms, ahead, kept} when
-- refused (ms until the first lease ends: the caller asks again then unless woken; -1 for a
-- foreign value without expiry, -2 when a permit is free but fair waiters come first; ahead how
-- many waiters are ahead in a fair line; kept the server ms until which its place in that line
-- is kept, 0: it took none: a release that hands a permit over names it, release.lua), or
-- {2, count} when the key is held with another count (1: an ordinary lock, a read-write lock,
-- or a string this library did not write). A permit a release handed over is the caller's
-- already (with a fencing token taken now, when it asks for one and the hand-over took none).
-- Every check comes before the first write: a counter that fence_ok refuses fails the script
-- with nothing changed.
local lock, token, ttl, n = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[4])
local fence_key = ARGV[3] == '1' and KEYS[2] or nil
local mark = KEYS[tonumber(ARGV[5]) or 0]
local line_at = tonumber(ARGV[6])
local line, places = KEYS[line_at or 0], KEYS[(line_at or 0) + 1]

local kind = redis.call('TYPE', lock).ok
local mode = kind == 'hash' and redis.call('HGET', lock, 'mode')
if kind == 'string' or mode == 'read' then
  return {2, 1}
end
if kind ~= 'none' and mode ~= 'permits' then
  -- A value of another type this library did not write: never overwritten.
  return {0, redis.call('PTTL', lock)}
end
local counter
if fence_key then
  counter = redis.call('GET', fence_key)
  if not fence_ok(counter) then
    return redis.error_reply('fence counter ' .. fence_key .. ' does not hold a non-negative integer below 2^53')
  end
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- The permits of live holders, when the first lease ends, and lapsed holders' fields.
local used, live, first_end, gone = {}, 0, nil, {}
if kind == 'hash' then
  local fields = redis.call('HGETALL', lock)
  for i = 1, #fields, 2 do
    local field, value = fields[i], fields[i + 1]
    if field ~= 'mode' and field ~= 'permits' then
      local ends, permit, fence = string.match(value, '^(%d+):(%d+):(%d+)$')
      ends = tonumber(ends)
      if ends and ends > now then
        if field == token then
          -- Ours already (a request sent again, or handed over): its lease counts from this
          -- attempt.
          if fence_key and fence == '0' then
            fence = string.format('%d', next_fence(fence_key, counter, ttl))
            redis.call('HSET', lock, token, string.format('%d:%s:%s', math.max(ends, now + ttl), permit, fence))
          elseif now + ttl > ends then
            redis.call('HSET', lock, token, string.format('%d:%s:%s', now + ttl, permit, fence))
          end
          if redis.call('PTTL', lock) < ttl then
            redis.call('PEXPIRE', lock, ttl)
          end
          return {1, tonumber(fence), tonumber(permit)}
        end
        used[tonumber(permit)] = true
        live = live + 1
        if not first_end or ends < first_end then
          first_end = ends
        end
      else
        gone[#gone + 1] = field
      end
    end
  end
  local stored = tonumber(redis.call('HGET', lock, 'permits'))
  if live > 0 and stored ~= n then
    return {2, stored or 0}
  end
end

local free
for permit = 0, n - 1 do
  if not used[permit] then
    free = permit
    break
  end
end
-- A fair semaphore's waiters ahead of the caller in line (lapsed places go first).
local ahead = 0
if line then
  local lapsed = redis.call('ZRANGEBYSCORE', places, '-inf', now)
  for _, waiter in ipairs(lapsed) do
    redis.call('ZREM', line, waiter)
    redis.call('ZREM', places, waiter)
  end
  -- (Counted with ZRANGE, a command the documented ACL grants: a line is short.)
  ahead = redis.call('ZRANK', line, token) or #redis.call('ZRANGE', line, 0, -1)
end
if not free or ahead >= n - live then
  local kept = 0
  if line and ARGV[8] == '1' then
    local place = tonumber(ARGV[7])
    join_line(line, token, time)
    kept = now + place
    redis.call('ZADD', places, kept, token)
    -- The line lives while someone asks (each within its place's life).
    redis.call('PEXPIRE', line, place + 1000)
    redis.call('PEXPIRE', places, place + 1000)
    ahead = redis.call('ZRANK', line, token)
  end
  -- A caller that will wait marks the lock as waited for, for as long as the hash lives (or,
  -- with the permits free but fair waiters ahead, a place's life) and a second more: each
  -- release announces itself while the mark stands (release.lua).
  if mark then
    local pttl = redis.call('PTTL', lock)
    redis.call('SET', mark, '1', 'PX', math.max(pttl, tonumber(ARGV[7]) or 0) + 1000)
  end
  return {0, first_end and first_end - now or -2, ahead, kept}
end
if line then
  redis.call('ZREM', line, token)
  redis.call('ZREM', places, token)
end
-- In slices: Lua's unpack takes a few thousand values at most.
for i = 1, #gone, 1000 do
  redis.call('HDEL', lock, unpack(gone, i, math.min(i + 999, #gone)))
end
local fence = 0
if fence_key then
  fence = next_fence(fence_key, counter, ttl)
end
redis.call('HSET', lock, 'mode', 'permits', 'permits', n, token, string.format('%d:%d:%d', now + ttl, free, fence))
if redis.call('PTTL', lock) < ttl then
  redis.call('PEXPIRE', lock, ttl)
end
return {1, fence, free}
