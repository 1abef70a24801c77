"""ops/prometheus/alerts.yml: valid rules, and each alert fires (and stays quiet) as its tests in
alerts_test.yml say, checked by Prometheus' own ``promtool``; its metrics are real ones."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.unit.metrics_exported import series_labels
from tests.unit.promql_refs import references

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


SCRAPE_LABELS = {"job", "instance", "namespace"}
"""Labels a series gets from its scrape: Prometheus' own, and the Kubernetes namespace that a
pod scrape's relabelling adds (absent elsewhere, where the rules group by its empty value)."""


def test_rules_use_only_exported_metrics() -> None:
    """Every series a rule reads is one a process serves, with the labels the rule uses."""
    exported = series_labels()
    rules = yaml.safe_load((RULES / "alerts.yml").read_text())
    used = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            for metric, labels in references(rule["expr"]).metrics.items():
                used.add(metric)
                assert metric in exported, f"{rule['alert']}: {metric} is not exported"
                missing = labels - exported[metric] - SCRAPE_LABELS
                assert not missing, f"{rule['alert']}: {metric} has no label {sorted(missing)}"
    assert len(used) >= 10
