"""Jobs that end when the test says so: each ``gate`` job opens a connection to :class:`Gates`
and blocks until the test closes it (or the worker running it dies), so a test waits for jobs
to start and lets them end on events, never on time."""

from __future__ import annotations

import socket
import time


class Gates:
    """The test's end of the gate jobs' connections."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._held: list[socket.socket] = []

    def wait_held(self, count: int, timeout_s: float) -> None:
        """Accept ``count`` connections: that many gate jobs are running."""
        deadline = time.monotonic() + timeout_s
        while len(self._held) < count:
            self._server.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                connection, _ = self._server.accept()
            except TimeoutError:
                raise AssertionError(
                    f"only {len(self._held)} of {count} gate jobs started within {timeout_s:g}s"
                ) from None
            self._held.append(connection)

    def release(self) -> None:
        for connection in self._held:
            connection.close()
        self._held.clear()

    def close(self) -> None:
        self.release()
        self._server.close()
