"""``/metrics`` (Prometheus text format), ``/healthz`` and, for a process that has one,
``/livez`` from a small threaded HTTP server."""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from ._errors import ConfigurationError

_log = logging.getLogger("pipeline.http")

Health = Callable[[], tuple[bool, str]]


def add_process_metrics(registry: CollectorRegistry) -> CollectorRegistry:
    """Adds the ``process_*`` metrics (CPU seconds, resident memory, open file descriptors,
    start time) of this process to ``registry``, as every ``/metrics`` of the project has them."""
    ProcessCollector(registry=registry)
    return registry


class PortInUseError(ConfigurationError):
    """Another process listens on the metrics port already."""

    def __init__(self, port: int) -> None:
        super().__init__(
            f"port {port} is in use; choose another with --metrics-port "
            "(or the metrics_port setting; 0 takes any free port)"
        )
        self.port = port


class MetricsServer:
    """Serves the registry and the health check on ``port`` (0: a free port) on every interface.
    ``live``, when given, answers ``/livez``: whether the process itself works, for a process
    whose ``/healthz`` also fails on what a restart does not mend (Kafka unreachable)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        health: Health,
        port: int,
        host: str = "",
        live: Health | None = None,
    ) -> None:
        handler = _handler(registry, {"/healthz": health} | ({"/livez": live} if live else {}))
        try:
            self._server = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(port) from exc
            # A port below 1024 without the right to bind it, an address not of this host...
            raise ConfigurationError(
                f"cannot serve on port {port}: {exc.strerror or exc}; choose another with "
                "--metrics-port (or the metrics_port setting; 0 takes any free port)"
            ) from exc
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="pipeline-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(
    registry: CollectorRegistry, checks: dict[str, Health]
) -> type[BaseHTTPRequestHandler]:
    paths = " or ".join(["/metrics", *checks])

    class Handler(BaseHTTPRequestHandler):
        head = False
        """Answering a HEAD: the status and headers of the GET, no body (probes use it)."""

        def do_HEAD(self) -> None:
            self.head = True
            self.do_GET()

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path in checks:
                ok, detail = checks[path]()
                self._send(200 if ok else 503, "text/plain; charset=utf-8", f"{detail}\n".encode())
            else:
                self._send(404, "text/plain; charset=utf-8", f"try {paths}\n".encode())

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not self.head:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            _log.debug("%s " + format, self.address_string(), *args)

    return Handler
