"""A real Prometheus server for a test: loopback only, a temp config and data dir, 1 s intervals.

:func:`start_prometheus` fails the test (never skips) when the ``prometheus`` binary is missing,
saying how to install it. :meth:`PrometheusServer.stop` sends SIGTERM and waits.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import waiting
from tests.integration.worker.harness.metrics import free_port

INSTALL = (
    "the prometheus server is not installed; install it with `apt-get install prometheus` "
    "(Debian/Ubuntu) or from https://prometheus.io/download/"
)


@dataclass
class PrometheusServer:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}{query}"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def alerts(self, name: str) -> list[dict[str, Any]]:
        """The active (pending or firing) alerts named ``name``."""
        found: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return [a for a in found if a["labels"].get("alertname") == name]

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def targets_up(self) -> dict[str, str]:
        """Scrape URL -> health (``up``, ``down``, ``unknown``) of every active target."""
        active = self.api("targets")["activeTargets"]
        return {t["scrapeUrl"]: t["health"] for t in active}

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_prometheus(tmp: Path, targets: dict[str, list[int]], rules: Path) -> PrometheusServer:
    """Prometheus scraping ``targets`` (job name -> ports on 127.0.0.1) every second, with
    ``rules`` evaluated every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(INSTALL, pytrace=False)
    jobs = "".join(
        f"  - job_name: {job}\n    static_configs:\n"
        f"      - targets: [{', '.join(f'127.0.0.1:{p}' for p in ports)}]\n"
        for job, ports in targets.items()
    )
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {rules}\nscrape_configs:\n{jobs}"
    )
    port = free_port()
    log = tmp / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = PrometheusServer(process, port, log)

    def ready() -> bool:
        if process.poll() is not None:
            return True
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    if not waiting.wait_for(ready, 60, interval=0.1) or process.poll() is not None:
        server.stop()
        pytest.fail(f"prometheus did not start:\n{server.output()}", pytrace=False)
    return server
