"""ops/prometheus/alerts.yml: valid rules, and each alert fires (and stays quiet) as its tests in
alerts_test.yml say, checked by Prometheus' own ``promtool``; its metrics are real ones."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.unit.metrics_exported import documented

RULES = Path(__file__).resolve().parents[2] / "ops" / "prometheus"
INSTALL = (
    "promtool (Prometheus' rule checker) is not installed; install it with "
    "`apt-get install prometheus` (Debian/Ubuntu) or from https://prometheus.io/download/"
)


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(INSTALL, pytrace=False)
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_rules_are_valid() -> None:
    result = run("check", "rules", str(RULES / "alerts.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rule_tests_pass() -> None:
    result = run("test", "rules", str(RULES / "alerts_test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_every_alert_has_a_test() -> None:
    rules = set(re.findall(r"^\s+- alert: (\w+)$", (RULES / "alerts.yml").read_text(), re.M))
    tested = set(re.findall(r"alertname: (\w+)", (RULES / "alerts_test.yml").read_text()))
    assert len(rules) >= 7
    assert rules == tested


def test_rules_use_only_exported_metrics() -> None:
    text = (RULES / "alerts.yml").read_text()
    exprs = " ".join(re.findall(r"expr: (?:>-\n)?((?:.+\n)+?)\s+(?:for|labels):", text))
    used = set(re.findall(r"\b(pipeline_[a-z_]+)", exprs))
    known = {name for metrics in documented().values() for name in metrics}
    histograms = {f"{n}_bucket" for n, t in documented()["scheduler"].items() if t == "histogram"}
    assert used
    assert used <= known | histograms, used - known - histograms
