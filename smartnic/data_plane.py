"""The agent's data plane as its settings make it: authenticated connections to the storage nodes (this
host's fabric identity) and the data path over them, with the deployment's KV MAC key. The agent's
control plane and its fast path's process each make their own."""
from __future__ import annotations

from collections.abc import Callable

from fabric.auth import FabricSecurity
from fabric.nodes import StorageNodes
from kvtb.credentials import Credentials, resolve_dir
from smartnic.datapath import Datapath
from smartnic.settings import SmartNicSettings


def data_plane(settings: SmartNicSettings, on_up: Callable | None = None) -> tuple[StorageNodes, Datapath]:
    """(storage nodes, data path), not started; on_up(name, client): a node (re)connected."""
    fabric = FabricSecurity.for_host(settings.fabric_security, settings.credentials_dir, settings.host_nqn)
    mac_key = Credentials(resolve_dir(settings.credentials_dir), "smartnic").kv_mac_key() if settings.kv_mac else None
    nodes = StorageNodes([(n.name, n.fabric_address) for n in settings.storage_nodes], settings.host_nqn,
                         settings.queue_depth, settings.fabric_timeout_s, settings.reconnect_interval_s, on_up=on_up,
                         security=fabric)
    datapath = Datapath(nodes, settings.namespace_id, settings.salt, settings.get_timeout_s, settings.datapath_workers,
                        settings.view_min_bytes, settings.get_pdu_bytes, mac_key, settings.lease_ms)
    return nodes, datapath
