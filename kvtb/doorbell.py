"""A doorbell: an eventfd that a poll loop watches, rung once per batch of work rather than per item.

A producer queues work, then rings; the loop answers (which re-arms the bell) and then takes
everything queued. A producer that finds the bell already rung skips the system call: the loop
has not answered yet, so it will see the new work when it drains. On a machine with few cores,
each eventfd write wakes the loop's thread, which then competes with the producer for the GIL
and the CPU; coalescing the rings of a burst of submissions saves one wake-up per item.
"""
from __future__ import annotations

import os


class Doorbell:
    """Thread-safe for many producers and one consumer (the loop that polls `fd`)."""

    def __init__(self):
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._rung = False

    def ring(self) -> None:
        """Wake the loop, unless it was rung since it last answered (or the bell is closed). Call after
        queuing the work."""
        if self._rung or self.fd < 0:
            return
        self._rung = True
        try:
            os.eventfd_write(self.fd, 1)
        except OSError:  # closed meanwhile: the loop has stopped
            pass

    def answer(self) -> None:
        """Re-arm the bell; call before draining the queue, so work queued later rings again.

        The eventfd is read before the bell is re-armed: the other way round, a ring between the
        two would be read away while the bell stayed rung, and the next work would wait unseen.
        """
        try:
            os.eventfd_read(self.fd)
        except (BlockingIOError, OSError):  # OSError: closed meanwhile
            pass
        self._rung = False

    def close(self) -> None:
        """Close the eventfd; later rings do nothing (its number may belong to another file by then)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)
