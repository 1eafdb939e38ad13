//! The Lua scripts a [`FleetCap`](crate::FleetCap) runs on Redis, for operators to read and
//! for tests to drive. Each runs atomically (a script blocks the server while it runs) and
//! reads the time from the server (`TIME`), so the replicas' clocks never meet.

/// Sets one replica's lease of one key, never above what the cap leaves it.
///
/// `KEYS[1]`: the key's lease hash (one field a replica: `slots:expires_ms`).
/// `ARGV`: the replica, the slots it wants, the cap, the lease's time to live in
/// milliseconds, and optionally the time now in milliseconds (tests; the server's `TIME`
/// otherwise).
///
/// Drops the leases that have expired, then grants `min(want, cap - others)` (never below
/// 0), where `others` is what the other replicas' live leases hold: the live leases of
/// every replica never add up to more than the cap. A grant of 0 removes the replica's
/// field. The hash expires with its last lease. Returns the slots granted.
pub const GRANT: &str = r"
local now
if ARGV[5] then
  now = tonumber(ARGV[5])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local replica, want, cap, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local others, latest = 0, 0
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  if fields[i] ~= replica then
    local lease = fields[i + 1]
    local at = string.find(lease, ':', 1, true)
    local slots = tonumber(string.sub(lease, 1, at - 1))
    local expires = tonumber(string.sub(lease, at + 1))
    if expires <= now then
      redis.call('HDEL', KEYS[1], fields[i])
    else
      others = others + slots
      if expires > latest then latest = expires end
    end
  end
end
local granted = math.max(0, math.min(want, cap - others))
if granted > 0 then
  redis.call('HSET', KEYS[1], replica, string.format('%d:%d', granted, now + ttl))
  if now + ttl > latest then latest = now + ttl end
else
  redis.call('HDEL', KEYS[1], replica)
end
if latest > 0 then
  redis.call('PEXPIREAT', KEYS[1], latest)
end
return granted
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
