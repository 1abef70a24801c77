"""The /metrics and /healthz server: a port it cannot serve is a clear settings error."""

from __future__ import annotations

import http.client
import socket

import pytest
from prometheus_client.registry import CollectorRegistry

from pipeline import ConfigurationError
from pipeline._metricsserver import MetricsServer, PortInUseError


def healthy() -> tuple[bool, str]:
    return True, "ok"


def test_a_port_in_use_and_an_address_it_cannot_bind_are_settings_errors() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port {port} is in use"):
            MetricsServer(CollectorRegistry(), healthy, port, host="127.0.0.1")
    # An address of no interface of this host (TEST-NET-1): a traceback before.
    with pytest.raises(ConfigurationError, match="cannot serve on port 0"):
        MetricsServer(CollectorRegistry(), healthy, 0, host="192.0.2.1")


def test_a_head_request_gets_the_status_of_the_get_without_a_body() -> None:
    """A load balancer's or an orchestrator's HEAD probe got 501."""
    server = MetricsServer(CollectorRegistry(), lambda: (False, "consumer thread died"), 0)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        connection.request("HEAD", "/healthz")
        response = connection.getresponse()
        assert response.status == 503
        assert response.read() == b""
        connection.close()
    finally:
        server.close()


def _get(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_livez_is_served_only_for_a_process_that_gives_it() -> None:
    """The exporter's /livez (its read loop turns) answers apart from its /healthz (its reads
    of Kafka work); the others serve no /livez."""
    server = MetricsServer(
        CollectorRegistry(), lambda: (False, "last read failed"), 0, live=lambda: (True, "ok")
    )
    plain = MetricsServer(CollectorRegistry(), lambda: (True, "ok"), 0)
    try:
        assert _get(server.port, "/healthz") == (503, b"last read failed\n")
        assert _get(server.port, "/livez") == (200, b"ok\n")
        assert _get(server.port, "/other") == (404, b"try /metrics or /healthz or /livez\n")
        assert _get(plain.port, "/livez") == (404, b"try /metrics or /healthz\n")
    finally:
        server.close()
        plain.close()
