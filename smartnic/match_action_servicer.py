"""The MatchAction gRPC service (P4Runtime-like Write/Read of table entries)."""
from __future__ import annotations

from kvtb_proto import smartnic_pb2, smartnic_pb2_grpc
from smartnic import match_action as ma
from smartnic.agent import Agent
from smartnic.grpc_errors import rpc

_TYPES = {smartnic_pb2.Action.FORWARD: ma.FORWARD, smartnic_pb2.Action.PREFETCH_KV: ma.PREFETCH_KV,
          smartnic_pb2.Action.DENY: ma.DENY, smartnic_pb2.Action.RATE_LIMIT: ma.RATE_LIMIT}
_PROTO_TYPES = {v: k for k, v in _TYPES.items()}


def action_from(msg: smartnic_pb2.Action) -> ma.Action:
    return ma.Action(_TYPES[msg.type], msg.compute_node, msg.rate_per_s, msg.burst)


def action_to(action: ma.Action) -> smartnic_pb2.Action:
    return smartnic_pb2.Action(type=_PROTO_TYPES[action.type], compute_node=action.compute_node,
                               rate_per_s=action.rate_per_s, burst=action.burst)


def match_from(msg: smartnic_pb2.FieldMatch) -> ma.Match:
    kind = msg.WhichOneof("kind")
    if kind == "exact":
        return ma.Match(msg.field, "exact", msg.exact.value)
    if kind == "lpm":
        return ma.Match(msg.field, "lpm", msg.lpm.prefix, msg.lpm.prefix_len)
    if kind == "ternary":
        return ma.Match(msg.field, "ternary", msg.ternary.value, msg.ternary.mask)
    raise ma.TableError(f"field {msg.field!r} has no exact, lpm or ternary match")


def match_to(m: ma.Match) -> smartnic_pb2.FieldMatch:
    if m.kind == "exact":
        return smartnic_pb2.FieldMatch(field=m.field, exact=smartnic_pb2.FieldMatch.Exact(value=str(m.value)))
    if m.kind == "lpm":
        return smartnic_pb2.FieldMatch(field=m.field, lpm=smartnic_pb2.FieldMatch.Lpm(
            prefix=str(m.value), prefix_len=m.mask_or_len))
    value = m.value if isinstance(m.value, int) else ma.addr_int(m.value)
    return smartnic_pb2.FieldMatch(field=m.field, ternary=smartnic_pb2.FieldMatch.Ternary(
        value=value, mask=m.mask_or_len))


def entry_from(msg: smartnic_pb2.TableEntry) -> ma.Entry:
    return ma.Entry(tuple(match_from(m) for m in msg.match), msg.priority, action_from(msg.action),
                    entry_id=msg.entry_id)


def entry_to(table: str, e: ma.Entry) -> smartnic_pb2.TableEntry:
    return smartnic_pb2.TableEntry(table=table, entry_id=e.entry_id, match=[match_to(m) for m in e.matches],
                                   priority=e.priority, action=action_to(e.action), hit_count=e.hit_count)


_UPDATE_KINDS = {smartnic_pb2.Update.INSERT: "insert", smartnic_pb2.Update.MODIFY: "modify",
                 smartnic_pb2.Update.DELETE: "delete"}


class MatchActionServicer(smartnic_pb2_grpc.MatchActionServicer):
    """Thin: translate entries and call the agent (which applies all updates or none)."""

    def __init__(self, agent: Agent):
        self.agent = agent

    @rpc
    def Write(self, request, context):
        updates = [(_UPDATE_KINDS[u.type], u.entry.table, entry_from(u.entry)) for u in request.updates]
        return smartnic_pb2.WriteResponse(entry_ids=self.agent.tables.write(updates))

    @rpc
    def Read(self, request, context):
        name, entries, default, default_hits = self.agent.tables.read(request.table)
        return smartnic_pb2.ReadResponse(entries=[entry_to(name, e) for e in entries],
                                         default_action=action_to(default), default_hit_count=default_hits)

    @rpc
    def SetDefaultAction(self, request, context):
        self.agent.tables.set_default(request.table, action_from(request.action))
        return smartnic_pb2.SetDefaultActionResponse()
