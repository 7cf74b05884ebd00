"""A working indicator for commands that run long, on a terminal only.

:class:`DelayedProgress` shows a spinner, what the command works on and the time elapsed on
stderr once the command has run for :data:`DELAY_S` seconds, and erases it when the command
ends or starts printing. It draws nothing when stderr is not a terminal (a log, a pipe, a test),
and ``rich`` (the library ``tangram verify`` draws its progress with) is imported only when
the indicator appears, so quick commands pay nothing for it.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

#: Seconds a command runs before the indicator appears.
DELAY_S = 2.0


class _StopOnWrite:
    """A stream that ends the indicator before the first text written to it, so the command's
    own output never mixes with the spinner's line."""

    def __init__(self, stream: TextIO, stop) -> None:
        self._stream = stream
        self._stop = stop

    def write(self, text: str) -> int:
        self._stop()
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class DelayedProgress:
    """Context manager: the indicator of one command.

    Parameters
    ----------
    text : str
        What the command works on (``"plan seed-llama3-70b"``).
    enabled : bool
        False for commands that draw their own progress (``verify``, ``bench``).
    delay_s : float
        Seconds before the indicator appears.
    stream : TextIO | None
        Where it draws (default: ``sys.stderr``); nothing unless it is a terminal.
    """

    def __init__(self, text: str, enabled: bool = True, delay_s: float = DELAY_S,
                 stream: TextIO | None = None) -> None:
        self.text = text
        self.delay_s = delay_s
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and _is_terminal(self.stream)
        self._lock = threading.Lock()
        self._closed = False
        self._bar: Any = None
        self._timer: threading.Timer | None = None
        self._saved: tuple[TextIO, TextIO] | None = None
        self._t0 = time.monotonic()

    @property
    def shown(self) -> bool:
        """Whether the indicator is on screen now."""
        return self._bar is not None

    def __enter__(self) -> "DelayedProgress":
        if not self.enabled:
            return self
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = _StopOnWrite(sys.stdout, self.stop)  # type: ignore[assignment]
        sys.stderr = _StopOnWrite(sys.stderr, self.stop)  # type: ignore[assignment]
        self._timer = threading.Timer(self.delay_s, self._show)
        self._timer.daemon = True
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved
            self._saved = None

    def stop(self) -> None:
        """Erase the indicator (if shown) and never show it again."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._bar is not None:
                self._bar.stop()
                self._bar = None

    def _show(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._bar = _spinner(self.text, self._t0, self.stream)
            self._bar.start()


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _spinner(text: str, t0: float, stream: TextIO) -> Any:
    """A one-line rich progress display: spinner, ``text``, minutes:seconds since ``t0``."""
    from rich.console import Console
    from rich.progress import Progress, ProgressColumn, SpinnerColumn, TextColumn
    from rich.text import Text

    class Since(ProgressColumn):
        """Time since the command started (not since the indicator appeared)."""

        def render(self, task: Any) -> Text:
            s = int(time.monotonic() - t0)
            return Text(f"{s // 60}:{s % 60:02d}", style="progress.elapsed")

    bar = Progress(SpinnerColumn(), TextColumn(f"tangram {text}: working"), Since(),
                   console=Console(file=stream), transient=True, redirect_stdout=False,
                   redirect_stderr=False)
    bar.add_task(text, total=None)
    return bar
