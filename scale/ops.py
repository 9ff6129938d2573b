"""The operations the testbed paces, where each is charged, and its modeled time under a profile.

| kind | where | modeled as |
| --- | --- | --- |
| gpu_step | the compute node's forward | the roofline step of the virtual model over the batch |
| swap_out, swap_in | the compute node's host-swap copies | gpu_to_host / host_to_gpu links |
| cpu_copy | the CPU-centric path: the copy out of the pool and the host stack | gpu_to_host + host_stack |
| host_to_wire | the CPU-centric path: the send to the storage node | host_to_wire + fabric |
| nic_put | the NIC's triggered PUT: trigger, gather, onto the wire | trigger latency + nic_dma + fabric |
| nic_get | the NIC's landing of a GET | nic_dma |
| nvme_write, nvme_read | the storage node's store and retrieve | the NVMe model by size (Table II/III's form) |

Bytes are virtual: a transfer of real bytes is charged for `kv_scale` times as many (the virtual
model's KV of the same tokens). Pure.
"""
from __future__ import annotations

from collections.abc import Sequence

from scale import costs
from scale.profile import Profile

KINDS = ("gpu_step", "swap_out", "swap_in", "cpu_copy", "host_to_wire", "nic_put", "nic_get",
         "nvme_write", "nvme_read")
TRANSFER_KINDS = ("cpu_copy", "host_to_wire", "nic_put", "nic_get", "nvme_write", "nvme_read")
RESOURCE = {"gpu_step": "gpu", "swap_out": "pcie", "swap_in": "pcie", "nic_put": "nic", "nic_get": "nic",
            "nvme_write": "nvme", "nvme_read": "nvme"}


def _link(p: Profile, *names: str):
    for name in names:
        if name in p.links:
            return p.links[name]
    return p.link(names[0])  # raises, naming the first


def modeled_s(p: Profile, kind: str, nbytes: float = 0.0, batch: Sequence[tuple[int, int]] = ()) -> float:
    """Modeled seconds of one operation of `kind` moving `nbytes` virtual bytes (or a step over `batch`)."""
    if kind == "gpu_step":
        return costs.gpu_step_s(p, batch)
    if kind == "swap_out":
        return costs.copy_s(_link(p, "gpu_to_host"), nbytes)
    if kind == "swap_in":
        return costs.copy_s(_link(p, "host_to_gpu", "gpu_to_host"), nbytes)
    if kind == "cpu_copy":
        return costs.copy_s(_link(p, "gpu_to_host"), nbytes) + costs.copy_s(_link(p, "host_stack"), nbytes)
    if kind == "host_to_wire":
        return costs.copy_s(_link(p, "host_to_wire"), nbytes) + costs.copy_s(_link(p, "fabric"), 0)
    if kind == "nic_put":
        return p.trigger_latency_s + costs.copy_s(_link(p, "nic_dma"), nbytes) + costs.copy_s(_link(p, "fabric"), 0)
    if kind == "nic_get":
        return costs.copy_s(_link(p, "nic_dma"), nbytes)
    if kind == "nvme_write":
        return costs.nvme_write_s(p, nbytes)
    if kind == "nvme_read":
        return costs.nvme_read_s(p, nbytes) + costs.copy_s(_link(p, "fabric"), 0)
    raise ValueError(f"unknown operation kind {kind!r} (known: {', '.join(KINDS)})")


def applies(p: Profile, kind: str) -> bool:
    """Whether the profile can cost `kind` (a profile without a GPU or a virtual model paces no step)."""
    if kind == "gpu_step":
        return p.gpu is not None and p.model is not None
    return True
