"""Stop strings on a reply's text as it streams (pure): what to send now, what to hold back, where to stop.

Text that could be the start of a stop string is held back until the next tokens tell: a stop
string split across tokens is matched and never streamed. On a match the reply ends before the
stop string (or just after it, with include_stop_str_in_output, as vLLM's option says); at the
end of a reply that matched nothing the held text goes out.
"""
from __future__ import annotations


class StopStrings:
    """One reply's stop-string matcher. Invariant: text already sent ends with no proper prefix of a
    stop string, so any match starts in the held text or in the new text."""

    def __init__(self, stops, include_stop_str_in_output: bool = False):
        self.stops = tuple(stops)
        self.include = include_stop_str_in_output
        self.held = ""
        self.longest = max((len(s) for s in self.stops), default=0)

    def push(self, text: str, check: bool = True) -> tuple[str, str | None]:
        """The reply's new text: (text to send now, the stop string it completed or None). With check
        False (min_tokens not reached yet) nothing matches, but a possible start is still held."""
        buffer = self.held + text
        if check:
            found = [(buffer.find(s), -len(s), s) for s in self.stops if s in buffer]
            if found:
                start, _, stop = min(found)  # the earliest; the longest of those starting there
                self.held = ""
                return buffer[:start + len(stop)] if self.include else buffer[:start], stop
        keep = self._held_length(buffer)
        self.held = buffer[len(buffer) - keep:]
        return buffer[:len(buffer) - keep], None

    def _held_length(self, buffer: str) -> int:
        """The longest end of buffer that is a proper prefix of a stop string."""
        for length in range(min(len(buffer), self.longest - 1), 0, -1):
            tail = buffer[-length:]
            if any(s.startswith(tail) for s in self.stops):
                return length
        return 0

    def flush(self) -> str:
        """The reply ended without a match: the held text."""
        held, self.held = self.held, ""
        return held
