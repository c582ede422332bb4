-- Give a lock back if it is still ours, and announce it to the waiters.
-- KEYS[1] lock key; for a fair lock only, KEYS[2] fair queue, KEYS[3] fair places (see
-- fair.lua) and KEYS[4] the fencing counter; for a semaphore's permit, KEYS[2] its line and
-- KEYS[3] its places (permit.lua); then the lock's waiting mark, when given (not on a Redis
-- Cluster): KEYS[5] for a fair lock, KEYS[4] for a permit, else KEYS[2]. ARGV[1] our token, ARGV[2] ms the lock must still be held (minimum hold), 0 to delete
-- now, ARGV[3] the announcement ('c:' and the releasing client's id: that client wakes its own
-- next waiter itself), ARGV[4] the lock's wake-up channel (an argument, not a key: see
-- acquire.lua), ARGV[5] '1' = a fair lock: announce whose turn it is instead ('2' = a permit,
-- whose fair line, if it has one, is named: see below), ARGV[6] '1' = a
-- Redis Cluster: announce with sharded pub/sub (SPUBLISH, on the lock's shard).
-- A fair release hands the lock to the next waiter in line: it sets the lock to that waiter's
-- token, until the waiter's place would have lapsed (so a waiter that died meanwhile holds the
-- line up no longer than its place would have), takes a fencing token for it when the key has a
-- counter, and names it: 'g:<fence>:<kept>:<token>' (fence 0: no counter; kept: until when the
-- place was kept, as the waiter's attempt that kept it was told). The waiter holds the lock
-- without asking (unless it must have replicas acknowledge it), and extends it to its own ttl
-- before that lease ends.
-- The waiting mark is set by the refused attempts of callers that will wait (acquire.lua,
-- share.lua): a lock that is not fair, deleted now without a mark beside it, is not announced,
-- since nobody listens for it (a client's own waiters are woken by the client itself). Every
-- release that ends its holder's turn takes the mark with it (the next holder's waiters set it
-- again as they are refused), so none outlives its lock.
-- Returns 1 when it was ours, 0 when it had expired or been taken by someone else, 2 when it
-- was ours but Redis refused the announcement (an ACL without rights on the channel): the
-- release itself stands, and waiters elsewhere wake on their timers.
-- With a minimum hold left, the key is kept (marked released) and expires then; waiters are told
-- so they re-read its now shorter expiry instead of sleeping on the old one.
-- A lock kept for its minimum hold is marked released (its value gets a ':released' suffix), so
-- that a renewal sent before the release but applied after it, which compares the bare token,
-- cannot extend it past the hold; a release sent again finds it marked and stands.
-- A key of another type answers GET with an error: not ours, and left alone, unless it is the
-- readers' hash of a read-write lock (share.lua) with a share of ours: the share goes, and the
-- hash with the last one, which is then announced (a writer may be waiting). Returns 3 when
-- other shares remain: nothing to announce, since no one can enter because a reader left.
-- Whether the key was deleted now (not kept for a minimum hold): only then can a fair release
-- hand the lock on.
-- Every check comes before the first write: a fair line of another type fails the release with
-- the lock left as it is (it expires at its ttl).
if (ARGV[5] == '1' or ARGV[5] == '2') and not (kind_ok(KEYS[2], 'zset') and kind_ok(KEYS[3], 'zset')) then
  return redis.error_reply('WRONGTYPE the fair line of ' .. KEYS[1] .. ' is not a sorted set')
end
local freed = false
-- Whether it was kept for its minimum hold instead.
local kept_for_hold = false
local mark = KEYS[(ARGV[5] == '1' and 5) or (ARGV[5] == '2' and 4) or 2]
-- Deletes the lock (and its waiting mark): whether the mark was there (always true without one).
local function delete()
  if not mark then
    redis.call('DEL', KEYS[1])
    return true
  end
  return redis.call('DEL', KEYS[1], mark) == 2
end
local held = redis.pcall('GET', KEYS[1])
if type(held) == 'table' and held.err and redis.pcall('HGET', KEYS[1], 'mode') == 'permits' then
  -- A semaphore's permit (permit.lua): its field goes (or, kept for its minimum hold, becomes
  -- '<token>:released' until the hold ends), the hash with the last holder, and the release is
  -- announced while a waiter's mark stands: each permit given back wakes one waiter.
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local kept = ARGV[1] .. ':released'
  local ends, rest = string.match(redis.call('HGET', KEYS[1], ARGV[1]) or '', '^(%d+)(:.*)$')
  if not ends then
    local earlier
    earlier, rest = string.match(redis.call('HGET', KEYS[1], kept) or '', '^(%d+)(:.*)$')
    if not (earlier and tonumber(earlier) > now) then
      return 0
    end
    -- Released before, and kept for its minimum hold: that release stands.
    if ARGV[2] ~= '0' then
      return 1
    end
    redis.call('HDEL', KEYS[1], kept)
  else
    redis.call('HDEL', KEYS[1], ARGV[1])
    if tonumber(ends) <= now then
      return 0
    end
    if ARGV[2] ~= '0' then
      redis.call('HSET', KEYS[1], kept, string.format('%d', now + tonumber(ARGV[2])) .. rest)
      -- The hash lasts as long as its latest lease: a hold longer than what was left of this
      -- permit's lease lengthens it (never shortens another holder's).
      redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
    end
  end
  -- A fair semaphore's permit given back now goes to the first waiter of its line whose place
  -- has not lapsed (lapsed ones go), until that place would have lapsed, and is named:
  -- 'p:0:<kept>:<permit>:<token>' (no fencing token: a waiter that wants one asks, and
  -- permit.lua takes it). Returns {5, token, kept, permit}: the releasing client hands it at
  -- once if the waiter is its own.
  local permit = string.match(rest, '^:(%d+):')
  if ARGV[5] == '2' and ARGV[2] == '0' and permit and redis.call('EXISTS', KEYS[2]) == 1 then
    for _, waiter in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
      redis.call('ZREM', KEYS[2], waiter)
      redis.call('ZREM', KEYS[3], waiter)
    end
    local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    local until_ms = head and tonumber(redis.call('ZSCORE', KEYS[3], head))
    if until_ms then
      redis.call('ZREM', KEYS[2], head)
      redis.call('ZREM', KEYS[3], head)
      redis.call('HSET', KEYS[1], head, string.format('%d:%s:0', until_ms, permit))
      redis.call('PEXPIRE', KEYS[1], until_ms - now, 'GT')
      -- (%d: concatenating a number writes a large one in exponent notation.)
      local said = string.format('p:0:%d:%s:', until_ms, permit) .. head
      local named = redis.pcall(ARGV[6] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[4], said)
      if type(named) == 'table' and named.err then
        return 2
      end
      return {5, head, until_ms, tonumber(permit)}
    end
  end
  local marked = not mark or redis.call('EXISTS', mark) == 1
  local fields = redis.call('HGETALL', KEYS[1])
  -- Only 'mode' and 'permits' left (HGETALL: the commands the rights check grants).
  if #fields <= 4 then
    delete()
  end
  if not marked then
    -- Nobody waits for it.
    return 1
  end
  local told = redis.pcall(ARGV[6] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[4], ARGV[3])
  if type(told) == 'table' and told.err then
    return 2
  end
  return 1
end
if type(held) == 'table' and held.err then
  local fields = redis.pcall('HGETALL', KEYS[1])
  if fields.err then
    return 0
  end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local mode, mine, others, last, gone = nil, nil, 0, 0, {ARGV[1]}
  for i = 1, #fields, 2 do
    local field, value = fields[i], fields[i + 1]
    if field == 'mode' then
      mode = value
    elseif field == ARGV[1] then
      mine = tonumber(value)
    else
      local expiry = tonumber(value)
      if expiry and expiry > now then
        others = others + 1
        last = math.max(last, expiry)
      else
        -- A reader that stopped renewing (crashed) without giving its share back.
        gone[#gone + 1] = field
      end
    end
  end
  if mode ~= 'read' or not mine then
    return 0
  end
  if others > 0 then
    -- In slices: Lua's unpack takes a few thousand values at most.
    for i = 1, #gone, 1000 do
      redis.call('HDEL', KEYS[1], unpack(gone, i, math.min(i + 999, #gone)))
    end
    redis.call('PEXPIRE', KEYS[1], last - now)
    if mine > now then
      return 3
    end
    return 0
  end
  delete()
  if mine <= now then
    return 0
  end
elseif held == ARGV[1] then
  if ARGV[2] ~= '0' then
    redis.call('SET', KEYS[1], ARGV[1] .. ':released', 'PX', ARGV[2])
    kept_for_hold = true
  else
    freed = true
  end
elseif held == ARGV[1] .. ':released' then
  -- Released before, and kept for its minimum hold: that release stands.
  if ARGV[2] ~= '0' then
    return 1
  end
  freed = true
else
  return 0
end
if freed then
  if not delete() and ARGV[5] ~= '1' then
    -- Nobody waits for it.
    return 1
  end
elseif kept_for_hold and mark then
  -- Kept for its minimum hold, and announced: its waiters ask again, and mark it again.
  redis.call('DEL', mark)
end
local message = ARGV[3]
if ARGV[5] == '1' then
  -- The first waiter whose place has not lapsed; lapsed ones go.
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  while true do
    local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if not head then
      break
    end
    local kept = tonumber(redis.call('ZSCORE', KEYS[3], head))
    if kept and kept > now then
      message = 'w:' .. head
      -- A counter that is not a number is left for the waiter's own attempt to refuse.
      local counter = freed and redis.pcall('GET', KEYS[4])
      if freed and fence_ok(counter) then
        local fence = counter and next_fence(KEYS[4], counter, kept - now) or 0
        redis.call('ZREM', KEYS[2], head)
        redis.call('ZREM', KEYS[3], head)
        redis.call('SET', KEYS[1], head, 'PX', kept - now)
        -- (%d: concatenating a number writes a large one in exponent notation.)
        message = 'g:' .. string.format('%d:%d:', fence, kept) .. head
      end
      break
    end
    redis.call('ZREM', KEYS[2], head)
    redis.call('ZREM', KEYS[3], head)
  end
end
local told = redis.pcall(ARGV[6] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[4], message)
if type(told) == 'table' and told.err then
  return 2
end
return 1
