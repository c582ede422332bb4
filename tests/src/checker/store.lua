-- The fenced store of the checker: a write is accepted only with a token at least as high as
-- the highest it has accepted, and every accepted write is appended to the key's history.
-- KEYS[1] the store hash (token, value, increments, rejected), KEYS[2] the history list.
-- ARGV[1] token, ARGV[2] writer, ARGV[3] 'enter' or 'set', ARGV[4] the value (with 'set').
-- Returns 1 when accepted, 0 when refused as stale.
local highest = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
if tonumber(ARGV[1]) < highest then
  redis.call('HINCRBY', KEYS[1], 'rejected', 1)
  return 0
end
redis.call('HSET', KEYS[1], 'token', ARGV[1])
if ARGV[3] == 'set' then
  redis.call('HSET', KEYS[1], 'value', ARGV[4])
  redis.call('HINCRBY', KEYS[1], 'increments', 1)
end
redis.call('RPUSH', KEYS[2], ARGV[1] .. ' ' .. ARGV[2] .. ' ' .. ARGV[3])
return 1
