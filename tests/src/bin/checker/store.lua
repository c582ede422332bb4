-- The checker's fenced store: a write is accepted only with a token at least as high as the
-- highest it has accepted. Every write, accepted or refused, is appended to the key's log, in
-- the order the store saw them: the log is what the checker reads the run back from.
-- KEYS[1] the store hash (token, value, increments, accepted, refused), KEYS[2] the log.
-- ARGV[1] token, ARGV[2] section (writer and attempt), ARGV[3] 'enter', 'poll' or 'set',
-- ARGV[4] the value (with 'set').
-- Each log line: token, section, op, 1 or 0 (accepted or not), the store's clock in ms.
-- Returns 1 when accepted, 0 when refused as stale.
local highest = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
local accepted = 1
if tonumber(ARGV[1]) < highest then
  accepted = 0
  redis.call('HINCRBY', KEYS[1], 'refused', 1)
else
  redis.call('HSET', KEYS[1], 'token', ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'accepted', 1)
  if ARGV[3] == 'set' then
    redis.call('HSET', KEYS[1], 'value', ARGV[4])
    redis.call('HINCRBY', KEYS[1], 'increments', 1)
  end
end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. accepted .. ' ' .. ms)
return accepted
