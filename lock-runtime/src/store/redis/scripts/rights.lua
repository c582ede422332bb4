-- Whether this client may run everything the other scripts run, checked once per client before
-- its first lock: a user whose ACL lacks a command (or the script commands themselves) is refused
-- then, naming what it lacks, instead of taking a lock it could not release (an uncontended
-- acquire is a bare SET; the release is a script).
-- KEYS[1], KEYS[2], KEYS[3]: probe keys beside a lock the client is about to take (its name and
-- ':rights', ':rights:z', ':rights:h'), so in its slot and under the key pattern its rights name.
-- They hold a string, a sorted set and a hash for a moment, each with an expiry, and are gone
-- when the script ends. Not checked: PUBLISH and SPUBLISH (without channel rights, waiters wake
-- on their timers; the client says so) and WAIT (not allowed in scripts; it follows an acquire).
-- Returns 1, or a NOPERM error naming the first command refused.
local steps = {
  {'TIME'},
  {'SET', KEYS[1], '0', 'PX', 1000},
  {'GET', KEYS[1]},
  {'PTTL', KEYS[1]},
  {'TYPE', KEYS[1]},
  {'PEXPIRE', KEYS[1], 1000, 'GT'},
  {'INCRBY', KEYS[1], 1},
  {'DEL', KEYS[1]},
  {'ZADD', KEYS[2], 1, 'probe'},
  {'PEXPIRE', KEYS[2], 1000},
  {'ZRANGE', KEYS[2], 0, 0},
  {'ZRANGEBYSCORE', KEYS[2], '-inf', '+inf'},
  {'ZSCORE', KEYS[2], 'probe'},
  {'ZRANK', KEYS[2], 'probe'},
  {'ZREM', KEYS[2], 'probe'},
  {'HSET', KEYS[3], 'probe', 1},
  {'PEXPIRE', KEYS[3], 1000},
  {'HGET', KEYS[3], 'probe'},
  {'HGETALL', KEYS[3]},
  {'HDEL', KEYS[3], 'probe'},
  {'EXISTS', KEYS[3]},
}
for _, step in ipairs(steps) do
  local answer = redis.pcall(unpack(step))
  if type(answer) == 'table' and answer.err
      and (string.find(answer.err, "can't run", 1, true) or string.find(answer.err, 'NOPERM', 1, true)) then
    redis.pcall('DEL', KEYS[1], KEYS[2], KEYS[3])
    return redis.error_reply('NOPERM this user may not run ' .. step[1] ..
      ' on the lock keys, which locking needs (grant +' .. string.lower(step[1]) .. ')')
  end
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return 1
