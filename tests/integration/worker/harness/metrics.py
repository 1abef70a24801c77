"""A worker's Prometheus endpoint, read the way Prometheus reads it."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(port: int) -> dict[str, float] | None:
    """Samples of ``http://localhost:<port>/metrics`` by series (``name{labels}``), or None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            samples[series] = float(value)
    return samples


def total(samples: dict[str, float], name: str) -> float:
    """The sum of every series of metric ``name`` (all label values)."""
    return sum(v for series, v in samples.items() if series.partition("{")[0] == name)


def health(port: int, path: str = "/healthz") -> tuple[int, str] | None:
    """Status and body of ``http://localhost:<port><path>``, or None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, OSError):
        return None
