"""The StorageAdmin gRPC servicer: thin translation between messages and the subsystem."""
from __future__ import annotations

import grpc


from fabric.status import NvmeError
from kvtb_proto import storage_admin_pb2 as pb
from kvtb_proto import storage_admin_pb2_grpc as pb_grpc
from scale.dilation import pacing_json
from storage_node.commit import GroupCommitter
from storage_node.kv_namespace import MAX_KEY_BYTES, KvNamespace
from storage_node.namespace import LBA_BYTES, Namespace
from storage_node.settings import WILDCARD
from storage_node.stats import Stats
from storage_node.subsystem import Subsystem

MODEL_NUMBER = "kvtestbed storage node"
FIRMWARE_REVISION = "0.1.0"


def namespace_info(ns: Namespace) -> pb.NamespaceInfo:
    """NamespaceInfo of ns, with the damage found in its files."""
    info = pb.NamespaceInfo(namespace_id=ns.nsid, command_set=ns.command_set, size_bytes=ns.size_bytes,
                            lba_size_bytes=LBA_BYTES, used_bytes=ns.used_bytes, key_count=ns.key_count,
                            backing_file=ns.path)
    if isinstance(ns, KvNamespace):
        info.journal_records_skipped = ns.journal.skipped_records
        info.journal_bytes_skipped = ns.journal.skipped_bytes
        info.values_lost = ns.values_lost
    return info


class StorageAdminServicer(pb_grpc.StorageAdminServicer):
    """Identify, Connect, Disconnect, CreateNamespace and Stats. Thread-safe (the subsystem locks)."""

    def __init__(self, subsystem: Subsystem, stats: Stats, fabric_address: str):
        self.subsystem = subsystem
        self.stats = stats
        self.fabric_address = fabric_address

    def _namespaces(self) -> list[pb.NamespaceInfo]:
        return [namespace_info(ns) for _, ns in sorted(self.subsystem.namespaces.items())]

    def Identify(self, request, context):
        s = self.subsystem.settings
        return pb.IdentifyResponse(
            subsystem_nqn=s.subsystem_nqn, serial_number=s.node_name, model_number=MODEL_NUMBER,
            firmware_revision=FIRMWARE_REVISION, max_queue_depth=s.queue_depth,
            max_key_length=MAX_KEY_BYTES, max_value_length=s.max_value_bytes,
            fabric_address=self.fabric_address, namespaces=self._namespaces(),
            connected_hosts=sorted(c.host_nqn for c in self.subsystem.controllers()))

    def Connect(self, request, context):
        try:
            controller = self.subsystem.admit(request.host_nqn)
        except NvmeError as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, exc.message)
        nsids = sorted(self.subsystem.namespaces) if controller.allowed == WILDCARD else sorted(
            n for n in controller.allowed if n in self.subsystem.namespaces)
        return pb.ConnectResponse(queue_id=controller.qid, queue_depth=controller.queue.depth,
                                  allowed_namespace_ids=nsids)

    def Disconnect(self, request, context):
        if not self.subsystem.disconnect_host(request.host_nqn):
            context.abort(grpc.StatusCode.NOT_FOUND, f"host {request.host_nqn!r} is not connected")
        return pb.DisconnectResponse()

    def CreateNamespace(self, request, context):
        try:
            ns = self.subsystem.create_namespace(request.namespace_id, request.command_set,
                                                 request.size_bytes)
        except NvmeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        except ValueError as exc:  # a size the allocator cannot lay out
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.CreateNamespaceResponse(namespace=namespace_info(ns))

    def Stats(self, request, context):
        snap = self.stats.snapshot()
        committers: list[GroupCommitter] = list(self.subsystem.committers.values())
        namespaces = list(self.subsystem.namespaces.values())
        return pb.StatsResponse(
            commands_completed=snap["commands_completed"], bytes_written=snap["bytes_written"],
            bytes_read=snap["bytes_read"],
            journal_records=sum(c.namespace.journal.records_written for c in committers),
            fsyncs=sum(ns.fsyncs for ns in namespaces) + sum(c.namespace.journal.fsyncs for c in committers),
            group_commits=sum(c.batches for c in committers),
            integrity_errors=sum(getattr(ns, "integrity_errors", 0) for ns in namespaces),
            commands=[pb.CommandCount(opcode=op, status=status, count=n)
                      for (op, status), n in sorted(snap["commands"].items())],
            namespaces=self._namespaces(),
            queue_depth_by_host={c.host_nqn: c.queue.outstanding for c in self.subsystem.controllers()},
            offline_namespaces={nsid: why for nsid, (_, why) in self.subsystem.offline.items()},
            pacing_json=pacing_json())

