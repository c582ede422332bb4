-- The checker's fenced store, for a transfer between two accounts (the `--sets` load): both
-- writes are accepted, or neither, and only with each account's token at least as high as the
-- highest it has accepted (store.lua's rule, per account). Both are appended to their account's
-- log, accepted or not.
-- KEYS[1] and KEYS[2] the first account's hash and log, KEYS[3] and KEYS[4] the second's.
-- ARGV[1] and ARGV[2] the two tokens, ARGV[3] the section, ARGV[4] and ARGV[5] the balances the
-- section read, ARGV[6] the amount moved from the first account to the second.
-- Each log line: token, section, 'set', 1 or 0, the store's clock in ms, the balance read, the
-- balance written.
-- Returns 1 when accepted, 0 when refused as stale.
local function highest(hash)
  return tonumber(redis.call('HGET', hash, 'token') or '0')
end
local accepted = tonumber(ARGV[1]) >= highest(KEYS[1]) and tonumber(ARGV[2]) >= highest(KEYS[3])
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local amount = tonumber(ARGV[6])
local function write(hash, log, token, from, to)
  if accepted then
    redis.call('HSET', hash, 'token', token, 'value', string.format('%d', to))
    redis.call('HINCRBY', hash, 'accepted', 1)
    redis.call('HINCRBY', hash, 'increments', 1)
  else
    redis.call('HINCRBY', hash, 'refused', 1)
  end
  redis.call('RPUSH', log, token .. ' ' .. ARGV[3] .. ' set ' .. (accepted and '1' or '0') .. ' ' .. ms
    .. ' ' .. string.format('%d', from) .. ' ' .. string.format('%d', to))
end
write(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[4]), tonumber(ARGV[4]) - amount)
write(KEYS[3], KEYS[4], ARGV[2], tonumber(ARGV[5]), tonumber(ARGV[5]) + amount)
return accepted and 1 or 0
