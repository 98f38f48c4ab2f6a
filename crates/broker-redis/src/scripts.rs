//! The Lua scripts that make publish, history reads and presence atomic on the shard that owns a
//! channel's slot.
//!
//! Publishing is one script: it assigns the offset (and the epoch, for a new stream), appends to
//! the history stream, trims it by size and age, and publishes the message, so that no node can see
//! a publication that is not stored, and a channel's messages leave Redis in offset order.
//!
//! # A stream's epoch is bound to the Redis process
//! Anything kept in Redis is rewound with it when Redis comes back from older data, so a stream's
//! epoch is bound to something a restart changes: the `run_id` of the Redis process that created
//! it, kept in the meta hash's field `r`. A stream bound to another `run_id` starts a new epoch on
//! its next publish or read, whichever node makes it, even one that never saw the stream. The
//! scripts get the identity as one argument: the `run_id` the node read when its connection
//! opened (standalone, shards, Sentinel: no extra round trip or Redis time per call), `*` to read
//! it with `INFO server` inside the script (Cluster, where the node does not know which master a
//! call reaches), or empty to bind nothing (the operator declared `synchronous_persistence`).

use std::sync::LazyLock;

use redis::Script;

/// Publish the same data to one or more channels of one slot (one shard, standalone). `KEYS`:
/// per channel meta, history and, when `ARGV[5]` is 3, its idempotency key. `ARGV`: `PUBLISH` or
/// `SPUBLISH`, info JSON (or empty), data, idempotency TTL (s), keys per channel (2 or 3), server
/// identity (see the module docs), then per channel eight: pub/sub channel, candidate epoch,
/// history size, history TTL (ms), meta TTL (ms), watermark epoch, watermark offset, and the
/// message's first field (`p`, or `p,<traceparent>` for a traced publication). Returns
/// `{epoch, offset, duplicate (0/1)}` per channel, flat, in order.
///
/// A stream starts over with the candidate epoch when it was bound to another server identity
/// (Redis restarted or failed over since: its data may be older than what was acknowledged), or
/// when its top is below the node's watermark in the same epoch (see
/// `herald_broker::watermark`). One call for several channels saves Redis the per-command part
/// of each (about a quarter of a publish's time there).
///
/// Entries older than the history TTL are trimmed (`XTRIM MINID`) on every `TRIM_EVERY`th offset
/// only, with the time taken from the id `XADD` just assigned (Redis's clock, or the stream's
/// last id if that clock went back) instead of a `TIME` call: those two commands were about a
/// fifth of the script's time in Redis. Trimming by age only frees memory early (`MAXLEN` and
/// the stream's TTL bound it anyway), since [`HISTORY`] counts expired entries as gone whether
/// or not they were trimmed.
pub(crate) static PUBLISH: LazyLock<Script> = LazyLock::new(|| Script::new(PUBLISH_SOURCE));

/// The source of [`PUBLISH`]: loaded with `SCRIPT LOAD` on each master connection of a Cluster
/// broadcast (`crate::masters`), whose pipelined calls use `EVALSHA` without a fallback.
pub(crate) const PUBLISH_SOURCE: &str = r#"
local TRIM_EVERY = 16
local command, info, data, idem_ttl, stride = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
local ident = ARGV[6]
if ident == '*' then
  ident = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
end

local function publish(meta, hist, idem, a)
  local m = redis.call('HMGET', meta, 'e', 'o', 'r')
  local epoch = m[1]
  if epoch and ident ~= '' and m[3] ~= ident then
    epoch = false
  elseif epoch and epoch == ARGV[a + 5] and tonumber(m[2]) < tonumber(ARGV[a + 6]) then
    epoch = false
  end
  if not epoch then
    epoch = ARGV[a + 1]
    redis.call('HSET', meta, 'e', epoch, 'o', 0)
    if ident ~= '' then redis.call('HSET', meta, 'r', ident) end
    redis.call('DEL', hist)
  end
  if idem then
    local seen = redis.call('GET', idem)
    if seen then
      local sep = string.find(seen, ':', 1, true)
      if sep and string.sub(seen, 1, sep - 1) == epoch then
        return epoch, tonumber(string.sub(seen, sep + 1)), 1
      end
    end
  end
  local offset = redis.call('HINCRBY', meta, 'o', 1)
  redis.call('PEXPIRE', meta, ARGV[a + 4])
  local size = tonumber(ARGV[a + 2])
  if size > 0 then
    local id = redis.call('XADD', hist, 'MAXLEN', size, '*', 'o', offset, 'd', data, 'i', info)
    if offset % TRIM_EVERY == 0 then
      local now = tonumber(string.match(id, '^%d+'))
      redis.call('XTRIM', hist, 'MINID', string.format('%d', now - tonumber(ARGV[a + 3])))
    end
    redis.call('PEXPIRE', hist, ARGV[a + 3])
  else
    redis.call('DEL', hist)
  end
  if idem then
    redis.call('SET', idem, epoch .. ':' .. offset, 'EX', idem_ttl)
  end
  local msg = ARGV[a + 7] .. ' ' .. epoch .. ' ' .. offset .. ' ' .. string.len(info) .. ' ' .. info .. data
  redis.call(command, ARGV[a], msg)
  return epoch, offset, 0
end

local out = {}
for n = 0, #KEYS / stride - 1 do
  local k = n * stride
  local idem = nil
  if stride == 3 then idem = KEYS[k + 3] end
  local epoch, offset, duplicate = publish(KEYS[k + 1], KEYS[k + 2], idem, 7 + n * 8)
  out[#out + 1] = epoch
  out[#out + 1] = offset
  out[#out + 1] = duplicate
end
return out
"#;

/// Read a stream's position and publications. `KEYS`: meta, history. `ARGV`: candidate epoch
/// (used when the stream does not exist: a read creates it, so that a subscriber and a later
/// publisher agree on the epoch), empty-stream TTL (ms: how long a stream nothing was published
/// to lives after its last read; each read of one extends it, a publish replaces it with the
/// meta TTL), history TTL (ms), since epoch (or empty for no `since`), since offset, limit (-1:
/// none), watermark epoch, watermark offset (a stream below the watermark rolled back and starts
/// over, as in [`PUBLISH`]), server identity (a stream bound to another starts over, as in
/// [`PUBLISH`]).
///
/// Returns `{epoch, top, continuous (0/1), o1, d1, i1, id1, o2, d2, i2, id2, …}` in offset order
/// (`id`: the stream entry's id, `<ms>-<n>`, whose `ms` is Redis's time when it was stored). With
/// `since`, publications are returned only if every one after `since` is still kept (recovery is
/// all or nothing); entries older than the history TTL count as gone even before a publish trims
/// them.
pub(crate) static HISTORY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local meta, hist = KEYS[1], KEYS[2]
local ident = ARGV[9]
if ident == '*' then
  ident = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
end
local m = redis.call('HMGET', meta, 'e', 'o', 'r')
local epoch = m[1]
if epoch and ident ~= '' and m[3] ~= ident then
  epoch = false
elseif epoch and epoch == ARGV[7] and tonumber(m[2]) < tonumber(ARGV[8]) then
  epoch = false
end
local top = 0
if not epoch then
  epoch = ARGV[1]
  redis.call('HSET', meta, 'e', epoch, 'o', 0)
  if ident ~= '' then redis.call('HSET', meta, 'r', ident) end
  redis.call('PEXPIRE', meta, ARGV[2])
  redis.call('DEL', hist)
else
  top = tonumber(m[2])
  if top == 0 then
    redis.call('PEXPIRE', meta, ARGV[2])
  end
end
-- Entries older than the history TTL count as gone: read from Redis's clock, and only when entries
-- are read.
local function cutoff()
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  return string.format('%d', now - tonumber(ARGV[3]))
end
local limit = tonumber(ARGV[6])
local out = {epoch, top, 1}
local entries
if ARGV[4] == '' then
  if limit == 0 then return out end
  if limit < 0 then
    entries = redis.call('XREVRANGE', hist, '+', cutoff())
  else
    entries = redis.call('XREVRANGE', hist, '+', cutoff(), 'COUNT', limit)
  end
else
  local since = tonumber(ARGV[5])
  if ARGV[4] ~= epoch or since > top then
    out[3] = 0
    return out
  end
  local need = top - since
  if need == 0 then return out end
  entries = redis.call('XREVRANGE', hist, '+', cutoff(), 'COUNT', need)
  local oldest = entries[#entries]
  if #entries ~= need or tonumber(oldest[2][2]) ~= since + 1 then
    out[3] = 0
    return out
  end
end
local first, last = #entries, 1
if ARGV[4] ~= '' and limit >= 0 and limit < #entries then
  last = #entries - limit + 1
end
for n = first, last, -1 do
  local f = entries[n][2]
  out[#out + 1] = f[2]
  out[#out + 1] = f[4]
  out[#out + 1] = f[6]
  out[#out + 1] = entries[n][1]
end
return out
"#,
    )
});

/// The Lua shared by the presence scripts. `KEYS`: presence hash (client → ClientInfo JSON),
/// expiry zset (client → expiry ms), order zset (client ids scored 0), users hash (user → clients
/// present). `forget` removes one client everywhere, decrementing its user's count once (only when
/// the order zset still held it, so a removal racing an expiry counts once); `expire_stale` forgets
/// every entry whose node stopped refreshing it.
macro_rules! presence_lua {
    () => {
        r#"
local function forget(client)
  local v = redis.call('HGET', KEYS[1], client)
  redis.call('HDEL', KEYS[1], client)
  redis.call('ZREM', KEYS[2], client)
  if redis.call('ZREM', KEYS[3], client) == 1 and v then
    local ok, who = pcall(cjson.decode, v)
    if ok and type(who) == 'table' and type(who.user) == 'string' then
      if redis.call('HINCRBY', KEYS[4], who.user, -1) <= 0 then
        redis.call('HDEL', KEYS[4], who.user)
      end
    end
  end
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function expire_stale()
  local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', string.format('%d', now_ms()))
  for _, client in ipairs(expired) do
    forget(client)
  end
end
"#
    };
}

/// Add or refresh presence entries. `KEYS`: as [`presence_lua`]. `ARGV`: TTL (ms), then triples
/// of client id, user and ClientInfo JSON. A client counts towards its user once, when it enters
/// the order zset; a refresh of a present client changes no count.
pub(crate) static PRESENCE_ADD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        presence_lua!(),
        r#"
local expires = string.format('%d', now_ms() + tonumber(ARGV[1]))
for n = 2, #ARGV, 3 do
  redis.call('HSET', KEYS[1], ARGV[n], ARGV[n + 2])
  redis.call('ZADD', KEYS[2], expires, ARGV[n])
  if redis.call('ZADD', KEYS[3], 'NX', 0, ARGV[n]) == 1 then
    redis.call('HINCRBY', KEYS[4], ARGV[n + 1], 1)
  end
end
for k = 1, 4 do
  redis.call('PEXPIRE', KEYS[k], ARGV[1])
end
return 1
"#
    ))
});

/// Remove a presence entry. `KEYS`: as [`presence_lua`]. `ARGV`: client id.
pub(crate) static PRESENCE_REMOVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        presence_lua!(),
        r#"
forget(ARGV[1])
return 1
"#
    ))
});

/// List presence, dropping expired entries first. `KEYS`: as [`presence_lua`]. Returns the
/// ClientInfo JSON of every live entry.
pub(crate) static PRESENCE_LIST: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        presence_lua!(),
        r#"
expire_stale()
return redis.call('HVALS', KEYS[1])
"#
    ))
});

/// Presence counts, dropping expired entries first. `KEYS`: as [`presence_lua`]. Returns
/// `{clients, users}` from `HLEN`s: no member is read.
pub(crate) static PRESENCE_STATS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        presence_lua!(),
        r#"
expire_stale()
return {redis.call('HLEN', KEYS[1]), redis.call('HLEN', KEYS[4])}
"#
    ))
});

/// One page of presence in client-id order, dropping expired entries first. `KEYS`: as
/// [`presence_lua`]. `ARGV`: the last client id of the previous page (empty for the first page),
/// page size. Returns `{more (0 or 1), {ClientInfo JSON, ...}}`; an id the order zset holds
/// without an entry (left by a node that removed it with an older script) is forgotten, not
/// returned, so a page may be shorter than asked while `more` is 1.
pub(crate) static PRESENCE_PAGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        presence_lua!(),
        r#"
expire_stale()
local from = '-'
if ARGV[1] ~= '' then
  from = '(' .. ARGV[1]
end
local limit = tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYLEX', KEYS[3], from, '+', 'LIMIT', 0, limit + 1)
local out = {}
local more = 0
for i, id in ipairs(ids) do
  if i > limit then
    more = 1
    break
  end
  local v = redis.call('HGET', KEYS[1], id)
  if v then
    out[#out + 1] = v
  else
    forget(id)
  end
end
return {more, out}
"#
    ))
});
