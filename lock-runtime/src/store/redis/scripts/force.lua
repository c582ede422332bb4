-- `lockctl release --force`: deletes the lock at KEYS[1] only if it still holds what the
-- operator was shown and agreed to release, with its waiting mark (KEYS[2]), and announces the
-- release on channel ARGV[3] so that a waiter takes the lock at once: with sharded pub/sub
-- (SPUBLISH, on the lock's shard) when ARGV[4] is '1' (a Redis Cluster, whose waiters listen
-- with SSUBSCRIBE), as the library's release.lua does. One script on the
-- connection lockctl read with: no holder that took the lock in between is deleted.
-- ARGV[1] the key's Redis type when read ('string', 'hash', or a foreign value's type), ARGV[2]
-- for a string the value read (its ':released' suffix, a lock kept for its minimum hold, is not
-- a change of hands; '' for a foreign string: any value that is not a lock's), for a hash 'read'
-- when it was a read-write lock's readers, 'permits' when a semaphore's holders (which come and
-- go: any readers' or holders' hash is the same lock) and '' when foreign.
-- Returns 1 when deleted, 0 when the key was already gone, -1 when it changed hands.
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
  return 0
end
if kind ~= ARGV[1] then
  return -1
end
if kind == 'string' then
  local function token(value)
    return (string.gsub(value, ':released$', ''))
  end
  local held = redis.call('GET', KEYS[1])
  if ARGV[2] == '' then
    -- A foreign value (lockctl was shown an excerpt of it): any value but a lock's, whose
    -- value starts with its 32-hex-digit token.
    if string.match(held, '^' .. string.rep('%x', 32) .. ' ') then
      return -1
    end
  elseif token(held) ~= token(ARGV[2]) then
    return -1
  end
elseif kind == 'hash' then
  -- A read-write lock's readers or a semaphore's holders (who come and go: any hash of the
  -- same kind is the same lock), or a foreign hash.
  local mode = redis.call('HGET', KEYS[1], 'mode')
  if mode ~= 'read' and mode ~= 'permits' then
    mode = ''
  end
  if mode ~= ARGV[2] then
    return -1
  end
end
redis.call('DEL', KEYS[1], KEYS[2])
-- Best effort, as in the library's release: without channel rights waiters wake on their timers.
redis.pcall(ARGV[4] == '1' and 'SPUBLISH' or 'PUBLISH', ARGV[3], 'released')
return 1
