"""SIGTERM/SIGINT before the event loop handles them: at start-up and during the final exit.

An orchestrator may stop a worker at any moment, also while the interpreter still imports the
application. The command installs these handlers first thing: a signal then means "do not
start" (exit 0, nothing was consumed), and a second one exits at once, as later on.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

EXIT_INTERRUPTED = 130
SIGNALS = (signal.SIGTERM, signal.SIGINT)

_received: list[int] = []
_installed: list[bool] = []


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    if len(_received) > 1:
        os._exit(EXIT_INTERRUPTED)


def catch_early() -> None:
    """Record SIGTERM/SIGINT instead of dying of them (main thread only)."""
    for sig in SIGNALS:
        signal.signal(sig, _on_signal)
    _installed.append(True)


def restore() -> None:
    """After the event loop's handlers are gone: record again, if :func:`catch_early` ran."""
    if _installed:
        for sig in SIGNALS:
            signal.signal(sig, _on_signal)


def received() -> bool:
    """Whether a stop signal arrived while only these handlers were installed."""
    return bool(_received)
