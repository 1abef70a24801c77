"""Serving the dashboard with uvicorn until SIGINT or SIGTERM, then exiting 0.

uvicorn stops gracefully on either signal, then raises the signal again once it is done (for an
application that installed a handler of its own): SIGINT then ends ``pipeline web`` with a
traceback and exit 1, SIGTERM kills it (exit 143). The worker and the scheduler exit 0 after a
stop they were asked for; so does the dashboard, with this server.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn

STOPS = (signal.SIGINT, signal.SIGTERM)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """The first signal stops gracefully, a second at once (uvicorn's ``handle_exit``);
        the previous handlers come back afterwards, and the signal is not raised again."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOPS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve(app: Any, sock: socket.socket) -> None:
    """Serve ``app`` on the listening ``sock`` until a stop signal."""
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    _Server(config).run(sockets=[sock])
