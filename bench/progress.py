"""A plain progress bar on stderr: no dependencies, silent when stderr is not a TTY or with --json."""
from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

logger = logging.getLogger(__name__)

BAR_WIDTH = 30
MIN_REDRAW_S = 0.1


class Progress:
    """Counts steps done out of total and redraws one line; not thread-safe (one owner)."""

    def __init__(self, total: int, label: str = "", *, enabled: bool | None = None,
                 stream: TextIO | None = None):
        self.total = max(int(total), 0)
        self.label = label
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        is_tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = is_tty if enabled is None else (enabled and is_tty)
        self._start_s = time.monotonic()
        self._last_draw_s = 0.0

    def __enter__(self) -> Progress:
        self._draw(force=True)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, steps: int = 1, note: str = "") -> None:
        """Mark steps more as done and redraw (at most every MIN_REDRAW_S)."""
        self.done = min(self.done + steps, self.total) if self.total else self.done + steps
        self._draw(note=note, force=self.done == self.total)

    def render(self, note: str = "") -> str:
        """The bar as text, e.g. `ttft [#####.....] 5/10 1.2s`."""
        frac = self.done / self.total if self.total else 0.0
        filled = int(round(frac * BAR_WIDTH))
        elapsed_s = time.monotonic() - self._start_s
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        text = f"{self.label} [{bar}] {self.done}/{self.total} {elapsed_s:.1f}s"
        return f"{text} {note}".rstrip()

    def close(self) -> None:
        """Draw the final state and end the line."""
        if self.enabled:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()
            self.enabled = False

    def _draw(self, note: str = "", force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last_draw_s < MIN_REDRAW_S:
            return
        self._last_draw_s = now
        self.stream.write("\r\x1b[K" + self.render(note))
        self.stream.flush()
