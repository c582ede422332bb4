-- Take every lock of a set (exclusive, not fair), each for its own token, or none of them: a
-- transfer's two accounts in one request. Every key is looked at before the first write, so a
-- refused set changes nothing. Idempotent (a request sent again finds the keys its own).
-- KEYS[1..n] the locks (one Cluster slot: the caller sends a set here only then); with
-- fencing, KEYS[n+1..2n] their fencing counters, in the same order.
-- ARGV[1] ttl in ms, ARGV[2] '1' = fencing, ARGV[3..n+2] the locks' tokens, in the same order.
-- Returns {1, fence_1, …, fence_n} when every lock was taken (fences 0 without fencing), or
-- {0, i, pttl, permits}: the i-th lock (1-based) is held by someone or something else, pttl its
-- holder's remaining ttl (-1 without expiry), permits the count a semaphore holds it with (0:
-- not a semaphore).
local fencing = ARGV[2] == '1'
local n = fencing and #KEYS / 2 or #KEYS
local ttl = ARGV[1]
local counters = {}
for i = 1, n do
  -- A value of another type answers GET with an error: not ours either.
  local held = redis.pcall('GET', KEYS[i])
  if held and held ~= ARGV[i + 2] then
    local permits = 0
    if type(held) == 'table' and redis.pcall('HGET', KEYS[i], 'mode') == 'permits' then
      permits = tonumber(redis.call('HGET', KEYS[i], 'permits')) or 0
    end
    return {0, i, redis.call('PTTL', KEYS[i]), permits}
  end
  if fencing then
    local counter = redis.call('GET', KEYS[n + i])
    if not fence_ok(counter) then
      return redis.error_reply('fence counter ' .. KEYS[n + i] .. ' does not hold a non-negative integer below 2^53')
    end
    counters[i] = counter
  end
end
local taken = {1}
for i = 1, n do
  local fresh = redis.call('SET', KEYS[i], ARGV[i + 2], 'NX', 'PX', ttl)
  local fence = 0
  if fencing then
    if fresh or not counters[i] then
      fence = next_fence(KEYS[n + i], counters[i], ttl)
    else
      -- Ours already (sent again): its token stands.
      redis.call('PEXPIRE', KEYS[i], ttl)
      fence = tonumber(counters[i])
    end
  elseif not fresh then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
  taken[i + 1] = fence
end
return taken
