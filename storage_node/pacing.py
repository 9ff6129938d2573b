"""Commands under a hardware profile: a store or retrieve occupies the modeled NVMe drive.

The real command runs as it always does (written and durable before its completion); its completion
is posted no earlier than its slot on the drive's timeline ends (D x the modeled NVMe time by size,
the slot starting when the previous command's ends). A completion later than that is a dilation
violation. The time each store arrived (the NVMe queue accepted it) is marked, for the reading in
which a transfer ends there.
"""
from __future__ import annotations

from collections.abc import Callable

from scale import paced

PACED = {"kv_store": "nvme_write", "nvm_write": "nvme_write", "kv_retrieve": "nvme_read", "nvm_read": "nvme_read",
         "kv_retrieve_ranges": "nvme_read"}


def wrap(cmd, finish: Callable) -> Callable:
    """`finish` wrapped so that it runs at the end of the command's slot on the modeled drive (itself
    in real time, or for a command the drive does not time)."""
    kind = PACED.get(cmd.spec.name)
    if kind is None or not paced.active():
        return finish
    nbytes = cmd.payload_bytes if kind == "nvme_write" else _read_bytes(cmd)
    arrived = paced.delivered(cmd.capsule.paced_until)  # when the sender's modeled link delivered it
    if kind == "nvme_write":
        paced.mark("store_accepted", arrived or None)
    ticket = paced.ticket(kind, nbytes, not_before=arrived)
    return lambda result: paced.finish(ticket, lambda: finish(result))


def _read_bytes(cmd) -> int:
    size = cmd.spec.size
    try:
        return int(size(cmd)) if size is not None else 0
    except Exception:  # noqa: BLE001 - a key that is gone: the command fails on its own, charge nothing
        return 0
