"""Counters of the storage node (commands by opcode and status, bytes, integrity errors)."""
from __future__ import annotations

import threading
from collections import Counter


class Stats:
    """Thread-safe counters; every method takes the lock briefly."""

    def __init__(self):
        self._lock = threading.Lock()
        self.commands: Counter[tuple[str, str]] = Counter()
        self.commands_completed = 0
        self.bytes_written = 0
        self.bytes_read = 0
        self.longest_command_s = 0.0  # the longest a command was outstanding, admitted to answered
        self.longest_command = ""      # which, and what it waited on last
        self.stalls = 0                # commands outstanding past the stall threshold, fabric loop stalls

    def record(self, opcode: str, status: str, bytes_written: int = 0, bytes_read: int = 0) -> None:
        """Count one completed command."""
        with self._lock:
            self.commands[(opcode, status)] += 1
            self.commands_completed += 1
            self.bytes_written += bytes_written
            self.bytes_read += bytes_read

    def count(self, opcode: str, status: str, n: int = 1) -> None:
        """Count n events that are not completed commands (a message dropped before authentication, a
        half-open handshake dropped): they show with the commands, by opcode and status."""
        if n:
            with self._lock:
                self.commands[(opcode, status)] += n

    def command_took(self, seconds: float, describe) -> None:
        """A command was answered `seconds` after it was admitted; describe() says which (asked only for
        a new longest)."""
        if seconds > self.longest_command_s:
            with self._lock:
                if seconds > self.longest_command_s:
                    self.longest_command_s, self.longest_command = seconds, describe()

    def stalled(self, n: int = 1) -> None:
        with self._lock:
            self.stalls += n

    def snapshot(self) -> dict:
        """A consistent copy of the counters."""
        with self._lock:
            return {"commands": dict(self.commands), "commands_completed": self.commands_completed,
                    "bytes_written": self.bytes_written, "bytes_read": self.bytes_read,
                    "longest_command_s": self.longest_command_s, "stalls": self.stalls}
