"""The nameserver's writes to the routing database, as atomic Lua scripts.

Every write is one script so that several nameservers can apply records and expire peers at the
same time without a lock: a heartbeat and an expiry of the same broker serialize in Redis.
The key schema is :mod:`tracemq.routing.keys`.
"""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis
from tracemq.naming import validate_topic
from tracemq.protocol.control import (
    BrokerRegister,
    BrokerUnregister,
    ClientHeartbeat,
    ClientUnregister,
)
from tracemq.routing.keys import RedisKeys
from tracemq.routing.model import QueueRoute

_REMOVE_BROKER = """
local function remove_broker(p, name)
  local bkey = p .. 'broker:' .. name
  local tkey = bkey .. ':topics'
  local changed = {}
  for _, t in ipairs(redis.call('SMEMBERS', tkey)) do
    local rkey = p .. 'route:' .. t
    redis.call('HDEL', rkey, name)
    if redis.call('HLEN', rkey) == 0 then
      redis.call('DEL', rkey)
      redis.call('SREM', p .. 'topics', t)
    end
    table.insert(changed, t)
  end
  local cluster = redis.call('HGET', bkey, 'cluster')
  if cluster then
    redis.call('SREM', p .. 'cluster:' .. cluster, name)
    if redis.call('SCARD', p .. 'cluster:' .. cluster) == 0 then
      redis.call('SREM', p .. 'clusters', cluster)
    end
  end
  redis.call('DEL', tkey, bkey)
  redis.call('ZREM', p .. 'brokers', name)
  return changed
end
local function publish(p, topics, brokers)
  if #topics > 0 or #brokers > 0 then
    local msg = '{"topics":' .. (#topics > 0 and cjson.encode(topics) or '[]') ..
                ',"brokers":' .. (#brokers > 0 and cjson.encode(brokers) or '[]') .. '}'
    redis.call('PUBLISH', p .. 'route-changes', msg)
  end
end
"""

# ARGV: prefix, name, cluster, info_json, ts, routes_json ({topic: route_json})
_REGISTER = (
    _REMOVE_BROKER
    + """
local p, name, cluster, info = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ts = tonumber(ARGV[5])
local routes = cjson.decode(ARGV[6])
local bkey = p .. 'broker:' .. name
local last = redis.call('HGET', bkey, 'last_msg_ts')
if last and tonumber(last) > ts then return {'stale'} end
local gone = redis.call('GET', p .. 'broker-gone:' .. name)
if gone and tonumber(gone) >= ts then return {'stale'} end
local isnew = redis.call('EXISTS', bkey) == 0
redis.call('HSET', bkey, 'info', info, 'last_seen', ARGV[5], 'last_msg_ts', ARGV[5], 'cluster', cluster)
redis.call('ZADD', p .. 'brokers', ARGV[5], name)
redis.call('SADD', p .. 'clusters', cluster)
redis.call('SADD', p .. 'cluster:' .. cluster, name)
local tkey = bkey .. ':topics'
local changed = {}
for _, t in ipairs(redis.call('SMEMBERS', tkey)) do
  if routes[t] == nil then
    local rkey = p .. 'route:' .. t
    redis.call('HDEL', rkey, name)
    if redis.call('HLEN', rkey) == 0 then
      redis.call('DEL', rkey)
      redis.call('SREM', p .. 'topics', t)
    end
    redis.call('SREM', tkey, t)
    table.insert(changed, t)
  end
end
for t, r in pairs(routes) do
  local rkey = p .. 'route:' .. t
  if redis.call('HGET', rkey, name) ~= r then
    redis.call('HSET', rkey, name, r)
    redis.call('SADD', p .. 'topics', t)
    redis.call('SADD', tkey, t)
    table.insert(changed, t)
  end
end
publish(p, changed, isnew and {name} or {})
local out = {isnew and 'new' or 'ok'}
for _, t in ipairs(changed) do table.insert(out, t) end
return out
"""
)

# ARGV: prefix, name, ts, tombstone_ttl_s
_UNREGISTER = (
    _REMOVE_BROKER
    + """
local p, name = ARGV[1], ARGV[2]
local ts = tonumber(ARGV[3])
local last = redis.call('HGET', p .. 'broker:' .. name, 'last_msg_ts')
if last and tonumber(last) > ts then return {'stale'} end
redis.call('SET', p .. 'broker-gone:' .. name, ARGV[3], 'EX', tonumber(ARGV[4]))
local changed = remove_broker(p, name)
publish(p, changed, {name})
local out = {'ok'}
for _, t in ipairs(changed) do table.insert(out, t) end
return out
"""
)

# ARGV: prefix, cutoff
_EXPIRE_BROKERS = (
    _REMOVE_BROKER
    + """
local p = ARGV[1]
local names = redis.call('ZRANGEBYSCORE', p .. 'brokers', '-inf', '(' .. ARGV[2])
local topics = {}
for _, name in ipairs(names) do
  for _, t in ipairs(remove_broker(p, name)) do table.insert(topics, t) end
end
publish(p, topics, names)
return names
"""
)

_REMOVE_CLIENT = """
local function remove_client(p, cid)
  local ckey = p .. 'client:' .. cid
  local group = redis.call('HGET', ckey, 'group')
  if group then
    local gkey = p .. 'group:' .. group .. ':clients'
    redis.call('SREM', gkey, cid)
    if redis.call('SCARD', gkey) == 0 then redis.call('DEL', p .. 'subs:' .. group) end
  end
  redis.call('DEL', ckey)
  redis.call('ZREM', p .. 'clients', cid)
end
"""

# ARGV: prefix, client_id, group, info_json, ts, then triples (topic, sub_json, history_field)
_CLIENT_HEARTBEAT = """
local p, cid, group, info = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local ts = tonumber(ARGV[5])
local ckey = p .. 'client:' .. cid
local last = redis.call('HGET', ckey, 'last_seen')
if last and tonumber(last) > ts then return 0 end
redis.call('HSET', ckey, 'info', info, 'last_seen', ARGV[5], 'group', group)
redis.call('ZADD', p .. 'clients', ARGV[5], cid)
redis.call('SADD', p .. 'group:' .. group .. ':clients', cid)
for i = 6, #ARGV, 3 do
  redis.call('HSET', p .. 'subs:' .. group, ARGV[i], ARGV[i + 1])
  local f = ARGV[i + 2]
  local h = redis.call('HGET', p .. 'subhistory', f)
  if h then
    local d = cjson.decode(h)
    if ts > d.last_seen then d.last_seen = ts end
    if ts < d.first_seen then d.first_seen = ts end
    redis.call('HSET', p .. 'subhistory', f,
      '{"first_seen":' .. string.format('%d', d.first_seen) ..
      ',"last_seen":' .. string.format('%d', d.last_seen) .. '}')
  else
    redis.call('HSET', p .. 'subhistory', f,
      '{"first_seen":' .. string.format('%d', ts) .. ',"last_seen":' .. string.format('%d', ts) .. '}')
  end
end
return 1
"""

# ARGV: prefix, client_id, ts
_CLIENT_UNREGISTER = (
    _REMOVE_CLIENT
    + """
local last = redis.call('HGET', ARGV[1] .. 'client:' .. ARGV[2], 'last_seen')
if last and tonumber(last) > tonumber(ARGV[3]) then return 0 end
remove_client(ARGV[1], ARGV[2])
return 1
"""
)

# ARGV: prefix, cutoff
_EXPIRE_CLIENTS = (
    _REMOVE_CLIENT
    + """
local p = ARGV[1]
local ids = redis.call('ZRANGEBYSCORE', p .. 'clients', '-inf', '(' .. ARGV[2])
for _, cid in ipairs(ids) do remove_client(p, cid) end
return ids
"""
)


# A signed record's first sighting wins; the same coordinates again are a re-read, not a replay.
_MARK_SEEN = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
return 0
"""


class RegistryWriter:
    """Applies control records to Redis. Every method is one atomic script call."""

    def __init__(self, redis: aioredis.Redis, prefix: str, tombstone_ttl_s: int = 3600) -> None:
        self.redis = redis
        self.prefix = prefix
        self.keys = RedisKeys(prefix)
        self.tombstone_ttl_s = tombstone_ttl_s
        self._register = redis.register_script(_REGISTER)
        self._unregister = redis.register_script(_UNREGISTER)
        self._expire_brokers = redis.register_script(_EXPIRE_BROKERS)
        self._client_hb = redis.register_script(_CLIENT_HEARTBEAT)
        self._client_unreg = redis.register_script(_CLIENT_UNREGISTER)
        self._expire_clients = redis.register_script(_EXPIRE_CLIENTS)
        self._mark_seen = redis.register_script(_MARK_SEEN)

    async def mark_seen(self, replay_key: str, where: str, ttl_ms: int) -> bool:
        """Remember a signature for ``ttl_ms`` with where it was read; False if it was already
        seen somewhere else (a replay). Shared by every nameserver on this Redis."""
        res = await self._mark_seen(
            keys=[f"{self.prefix}seen:{replay_key}"], args=[where, max(1, ttl_ms)]
        )
        return bool(res)

    async def register_broker(self, rec: BrokerRegister) -> tuple[str, list[str]]:
        """Returns (``new`` | ``ok`` | ``stale``, topics whose route changed)."""
        routes: dict[str, str] = {}
        for topic, cfg in rec.topics.items():
            validate_topic(topic)
            routes[topic] = QueueRoute.build(rec.broker, cfg).to_json()
        info = rec.broker.model_dump_json()
        res = await self._register(
            args=[
                self.prefix,
                rec.broker.broker_name,
                rec.broker.cluster,
                info,
                rec.ts,
                json.dumps(routes) if routes else "{}",
            ]
        )
        return str(res[0]), [str(t) for t in res[1:]]

    async def unregister_broker(self, rec: BrokerUnregister) -> tuple[str, list[str]]:
        res = await self._unregister(
            args=[self.prefix, rec.broker_name, rec.ts, self.tombstone_ttl_s]
        )
        return str(res[0]), [str(t) for t in res[1:]]

    async def expire_brokers(self, cutoff_ms: int) -> list[str]:
        return [str(n) for n in await self._expire_brokers(args=[self.prefix, cutoff_ms])]

    async def client_heartbeat(self, rec: ClientHeartbeat) -> bool:
        args: list[Any] = [self.prefix, rec.client_id, rec.group, rec.model_dump_json(), rec.ts]
        for sub in rec.subscriptions:
            args += [
                sub.topic,
                json.dumps(
                    {
                        "expression": sub.expression,
                        "message_model": rec.message_model,
                        "updated": rec.ts,
                    }
                ),
                RedisKeys.subhistory_field(rec.group, sub.topic, sub.expression, rec.message_model),
            ]
        return bool(await self._client_hb(args=args))

    async def client_unregister(self, rec: ClientUnregister) -> bool:
        return bool(await self._client_unreg(args=[self.prefix, rec.client_id, rec.ts]))

    async def expire_clients(self, cutoff_ms: int) -> list[str]:
        return [str(c) for c in await self._expire_clients(args=[self.prefix, cutoff_ms])]

    async def live_broker_count(self) -> int:
        return int(await self.redis.zcard(self.keys.brokers))
