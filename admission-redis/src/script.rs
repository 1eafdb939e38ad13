//! The Lua scripts a [`FleetCap`](crate::FleetCap) runs on Redis, for operators to read and
//! for tests to drive. Each runs atomically (a script blocks the server while it runs) and
//! reads the time from the server (`TIME`), so the replicas' clocks never meet.

/// Sets one replica's lease of one key, never above what the cap leaves it, and, while
/// other replicas wait for slots, never above a fair share; tells the other replicas when
/// one waits for slots they hold, and when slots a waiter may take are given back.
///
/// `KEYS[1]`: the key's lease hash: a field a replica holding a lease (`slots:expires_ms`),
/// and a field `~` and a replica for one that waits (`expires_ms`).
/// `ARGV`: the replica, the slots it wants, the cap, the lease's time to live in
/// milliseconds, the channel the replicas listen on (empty: tell nobody), and optionally
/// the time now in milliseconds (tests; the server's `TIME` otherwise).
///
/// Drops what has expired, then grants `min(want, cap - others)` (never below 0), where
/// `others` is what the other replicas' live leases hold: the live leases of every replica
/// never add up to more than the cap. While replicas that hold no lease wait, the fair
/// share is `ceil(cap / n)`, n counting the other holders, those waiters and this replica
/// (the cap, while none wait), and a lease does not grow past it; one already above it is
/// not cut here (its replica may have that many in flight) but told the share, to lower
/// its own cap at once and its lease at its next renewal. A grant below what was asked
/// marks the replica as waiting (for the time to live); a full one clears the mark. A
/// grant of 0 removes the replica's lease. The hash expires with the last of its fields.
///
/// On the channel: `w<replica> <KEYS[1]>` when a grant falls short while other replicas
/// hold slots (they give back what they do not use), and `f<replica> <KEYS[1]>` when a
/// lease is lowered while another replica waits (it asks again).
/// Returns the slots granted, the fair share, and what was said: 0 nothing, 1 `w`, 2 `f`.
pub const GRANT: &str = r"
local now
if ARGV[6] then
  now = tonumber(ARGV[6])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local replica, want, cap, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local channel = ARGV[5]
local mark = '~' .. replica
local others, holders, latest, own = 0, 0, 0, 0
local holding, waiting = {}, {}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local field, value = fields[i], fields[i + 1]
  if string.sub(field, 1, 1) == '~' then
    local expires = tonumber(value)
    if expires <= now then
      redis.call('HDEL', KEYS[1], field)
    else
      if field ~= mark then waiting[string.sub(field, 2)] = true end
      if expires > latest then latest = expires end
    end
  else
    local at = string.find(value, ':', 1, true)
    local slots = tonumber(string.sub(value, 1, at - 1))
    local expires = tonumber(string.sub(value, at + 1))
    if field == replica then
      if expires > now then own = slots end
    elseif expires <= now then
      redis.call('HDEL', KEYS[1], field)
    else
      others = others + slots
      holders = holders + 1
      holding[field] = true
      if expires > latest then latest = expires end
    end
  end
end
local granted = math.max(0, math.min(want, cap - others))
local waiters = 0
for waiter in pairs(waiting) do
  if not holding[waiter] then waiters = waiters + 1 end
end
local fair = cap
if waiters > 0 then
  fair = math.ceil(cap / (holders + waiters + 1))
  granted = math.min(granted, math.max(fair, own))
end
if granted < want then
  redis.call('HSET', KEYS[1], mark, now + ttl)
  if now + ttl > latest then latest = now + ttl end
else
  redis.call('HDEL', KEYS[1], mark)
end
if granted > 0 then
  redis.call('HSET', KEYS[1], replica, string.format('%d:%d', granted, now + ttl))
  if now + ttl > latest then latest = now + ttl end
else
  redis.call('HDEL', KEYS[1], replica)
end
if latest > 0 then
  redis.call('PEXPIREAT', KEYS[1], latest)
end
local said = 0
if granted < want and holders > 0 then
  said = 1
elseif granted < own and next(waiting) ~= nil then
  said = 2
end
if said > 0 and channel and channel ~= '' then
  local word = 'w'
  if said == 2 then word = 'f' end
  redis.call('PUBLISH', channel, word .. replica .. ' ' .. KEYS[1])
end
return {granted, fair, said}
";

/// Registers one replica as live and counts the live ones.
///
/// `KEYS[1]`: the set of replicas (a sorted set scored by expiry). `ARGV`: the replica,
/// the time to live in milliseconds, and optionally the time now in milliseconds.
/// Returns how many replicas are live, this one included.
pub const HEARTBEAT: &str = r"
local now
if ARGV[3] then
  now = tonumber(ARGV[3])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], 0, 0, 'REV', 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]))
return redis.call('ZCARD', KEYS[1])
";
