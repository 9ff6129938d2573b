"""NVMe status codes (status code type, status code) used by the storage node and its hosts.

Generic (SCT 0) and media (SCT 2) values follow NVMe Base 2.0. Command-specific (SCT 1)
values come from two specifications:

- NVMe-oF Connect: 0x84 "Connect Invalid Host". The node answers it to any capsule from a
  host that is not connected or not in the access list (the paper's NIC-2 match-action).
- NVMe Key Value Command Set 1.0: 0x85 invalid value size, 0x86 invalid key size,
  0x87 key does not exist, 0x89 key exists.
- This testbed's own: 0x8A key leased (a KV_DELETE of a key another host leased by a read with
  CommandCapsule.lease_ms: nothing is deleted).
"""
from __future__ import annotations

from typing import NamedTuple

SCT_GENERIC = 0
SCT_COMMAND_SPECIFIC = 1
SCT_MEDIA = 2


class Status(NamedTuple):
    """A completion status: status code type and status code."""

    sct: int
    sc: int

    @property
    def ok(self) -> bool:
        return self.sct == 0 and self.sc == 0


SUCCESS = Status(SCT_GENERIC, 0x00)
INVALID_OPCODE = Status(SCT_GENERIC, 0x01)
INVALID_FIELD = Status(SCT_GENERIC, 0x02)
COMMAND_ID_CONFLICT = Status(SCT_GENERIC, 0x03)
INTERNAL_ERROR = Status(SCT_GENERIC, 0x06)
# the queue is full (NVMe 1.4 "Command Interrupted", retryable: send it again after a completion)
COMMAND_INTERRUPTED = Status(SCT_GENERIC, 0x21)
INVALID_NAMESPACE = Status(SCT_GENERIC, 0x0B)
NAMESPACE_NOT_READY = Status(SCT_GENERIC, 0x82)
LBA_OUT_OF_RANGE = Status(SCT_GENERIC, 0x80)
CAPACITY_EXCEEDED = Status(SCT_GENERIC, 0x81)

CONNECT_INVALID_PARAMETERS = Status(SCT_COMMAND_SPECIFIC, 0x82)
CONNECT_INVALID_HOST = Status(SCT_COMMAND_SPECIFIC, 0x84)
INVALID_VALUE_SIZE = Status(SCT_COMMAND_SPECIFIC, 0x85)
INVALID_KEY_SIZE = Status(SCT_COMMAND_SPECIFIC, 0x86)
KEY_DOES_NOT_EXIST = Status(SCT_COMMAND_SPECIFIC, 0x87)
KEY_EXISTS = Status(SCT_COMMAND_SPECIFIC, 0x89)
KEY_LEASED = Status(SCT_COMMAND_SPECIFIC, 0x8A)

WRITE_FAULT = Status(SCT_MEDIA, 0x80)
UNRECOVERED_READ_ERROR = Status(SCT_MEDIA, 0x81)
GUARD_CHECK_ERROR = Status(SCT_MEDIA, 0x82)  # end-to-end guard (crc) mismatch on a Write/Store

NAMES: dict[Status, str] = {
    SUCCESS: "success",
    INVALID_OPCODE: "invalid opcode",
    INVALID_FIELD: "invalid field",
    COMMAND_ID_CONFLICT: "command id conflict",
    INTERNAL_ERROR: "internal error",
    COMMAND_INTERRUPTED: "command interrupted",
    INVALID_NAMESPACE: "invalid namespace",
    NAMESPACE_NOT_READY: "namespace not ready",
    LBA_OUT_OF_RANGE: "LBA out of range",
    CAPACITY_EXCEEDED: "capacity exceeded",
    CONNECT_INVALID_PARAMETERS: "connect invalid parameters",
    CONNECT_INVALID_HOST: "invalid host",
    INVALID_VALUE_SIZE: "invalid value size",
    INVALID_KEY_SIZE: "invalid key size",
    KEY_DOES_NOT_EXIST: "key does not exist",
    KEY_EXISTS: "key exists",
    KEY_LEASED: "key leased",
    WRITE_FAULT: "write fault",
    UNRECOVERED_READ_ERROR: "unrecovered read error",
    GUARD_CHECK_ERROR: "end-to-end guard check error",
}


def status_name(sct: int, sc: int) -> str:
    """Return a readable name for (sct, sc)."""
    return NAMES.get(Status(sct, sc), f"sct {sct:#x} sc {sc:#04x}")


class NvmeError(Exception):
    """A command failed with an NVMe status; raised by the logic, turned into a response."""

    def __init__(self, status: Status, message: str = ""):
        super().__init__(message or status_name(*status))
        self.status = status
        self.message = message or status_name(*status)
