"""A metrics port that another process holds: one line saying so, exit 2, no traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

APP = """
from pipeline import Pipeline

app = Pipeline()

@app.job("noop")
async def noop() -> None:
    return None
"""


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port something else listens on, on every interface (as the metrics server binds)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("service", ["pipeline_worker", "pipeline_scheduler"])
def test_a_metrics_port_in_use_is_one_line_and_exit_2(
    service: str, held_port: int, tmp_path: Path
) -> None:
    (tmp_path / "portapp.py").write_text(APP)
    result = subprocess.run(
        [sys.executable, "-m", service, "--app", "portapp", "--metrics-port", str(held_port)],
        cwd=tmp_path,
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        # Nothing listens there: the port is the first thing the service meets.
        env={**os.environ, "PIPELINE_BOOTSTRAP_SERVERS": "127.0.0.1:9"},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    assert f"Error: port {held_port} is in use; choose another with --metrics-port" in output
    assert len(result.stderr.strip().splitlines()) <= 3, output
