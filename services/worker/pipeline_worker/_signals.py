"""SIGTERM/SIGINT: before the event loop handles them (start-up, the final exit), and on it.

An orchestrator may stop a worker at any moment, also while the interpreter still imports the
application. The command installs these handlers first thing: a signal then means "do not
start" (exit 0, nothing was consumed), and a second one exits at once, as later on. While the
worker runs, :class:`LoopSignals` handles them on the event loop: the first stops gracefully,
a second exits at once without committing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

EXIT_INTERRUPTED = 130
SIGNALS = (signal.SIGTERM, signal.SIGINT)

_log = logging.getLogger("pipeline.worker")

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


class LoopSignals:
    """SIGTERM/SIGINT on the event loop while the worker runs (main thread only: a worker
    embedded in another thread is stopped by its host)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, stop: Callable[[], None], timeout_s: float
    ) -> None:
        self._loop = loop
        self._stop = stop
        self._timeout_s = timeout_s
        self._count = 0
        self._on = threading.current_thread() is threading.main_thread()

    def install(self) -> None:
        if self._on:
            for sig in SIGNALS:
                self._loop.add_signal_handler(sig, self._on_signal, sig)

    def remove(self) -> None:
        if not self._on:
            return
        for sig in SIGNALS:
            self._loop.remove_signal_handler(sig)
        restore()  # a signal while exiting must not kill the process with it

    def _on_signal(self, sig: signal.Signals) -> None:
        self._count += 1
        if self._count == 1:
            _log.info(
                "%s received: stopping gracefully (a second signal exits at once)",
                sig.name,
                extra={"timeout_s": self._timeout_s},
            )
            self._stop()
            return
        _log.warning("%s received again: exiting now without committing", sig.name)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_INTERRUPTED)
