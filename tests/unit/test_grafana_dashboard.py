"""ops/grafana/dashboards/pipeline.json: a dashboard Grafana's file provisioning loads, whose
panels read the provisioned Prometheus data source, and whose every query parses (Prometheus'
own ``promtool``) and asks only for series and labels that a worker, a scheduler or an
exporter really serves (their registries, built as the processes build them)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.metrics_exported import series_labels
from tests.unit.promql_refs import references
from tests.unit.test_alert_rules import promtool

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "ops" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "pipeline.json"
TARGET_LABELS = frozenset({"job", "instance"})
"""The labels Prometheus adds to every series it scrapes (the metrics carry no namespace)."""
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
"""Grafana's own variables, with a value of the right kind for promtool."""
Dashboard = dict[str, Any]


def load() -> Dashboard:
    dashboard: Dashboard = json.loads(DASHBOARD.read_text())
    return dashboard


def provisioned_datasource() -> dict[str, str]:
    config = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    (source,) = [s for s in config["datasources"] if s["type"] == "prometheus"]
    return {"type": "prometheus", "uid": source["uid"]}


def panels(dashboard: Dashboard) -> Iterator[dict[str, Any]]:
    """Every panel with queries (rows hold panels only when collapsed)."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def queries(dashboard: Dashboard) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target and of every query variable's metric."""
    for panel in panels(dashboard):
        for target in panel["targets"]:
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["query"]["query"])
            assert found is not None, f"variable {variable['name']}: not label_values(...)"
            yield f"variable {variable['name']}", f"count by ({found[2]}) ({found[1]})"


def unknown_references(dashboard: Dashboard) -> list[str]:
    """Each series a query reads that no process exports, and each label it selects or groups
    by that the series does not carry."""
    exported = series_labels()
    problems = []
    for where, expr in queries(dashboard):
        refs = references(expr).metrics
        if not refs:
            problems.append(f"{where}: reads no metric: {expr}")
        for metric, labels in refs.items():
            if metric not in exported:
                problems.append(f"{where}: {metric} is not exported by any process")
                continue
            missing = labels - exported[metric] - TARGET_LABELS
            if missing:
                problems.append(f"{where}: {metric} has no label {sorted(missing)}")
    return problems


def expanded(expr: str, variables: set[str]) -> str:
    """``expr`` with Grafana's variables replaced as Grafana would (a regex for ours)."""

    def value(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        if name in BUILTINS:
            return BUILTINS[name]
        assert name in variables, f"${name} is not a variable of the dashboard: {expr}"
        return ".*"

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def unparsable(dashboard: Dashboard, workdir: Path) -> str:
    """promtool's complaints about the queries, as one recording rule each ("" when none)."""
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    rules = [
        {"record": f"dashboard:query_{index}", "expr": expanded(expr, variables)}
        for index, (_, expr) in enumerate(queries(dashboard))
    ]
    path = workdir / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [promtool(), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return "" if done.returncode == 0 else done.stdout + done.stderr


def test_provisioning_loads_this_directory() -> None:
    provider = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "pipeline.yml").read_text()
    )
    (files,) = provider["providers"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = dict(v.rsplit(":", 2)[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["./ops/grafana/dashboards"] == files["options"]["path"]
    assert mounts["./ops/grafana/provisioning"] == "/etc/grafana/provisioning"


def test_dashboard_has_what_provisioning_needs() -> None:
    dashboard = load()
    assert re.fullmatch(r"[\w-]{1,40}", dashboard["uid"])
    assert dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    assert dashboard["schemaVersion"] >= 39
    assert "id" not in dashboard or dashboard["id"] is None  # Grafana assigns it
    nested = [p for row in dashboard["panels"] for p in row.get("panels", [])]
    ids = [p["id"] for p in dashboard["panels"] + nested]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        assert grid["h"] > 0, panel["title"]


def test_every_panel_queries_the_provisioned_datasource() -> None:
    source = provisioned_datasource()
    dashboard = load()
    found = list(panels(dashboard))
    assert len(found) >= 10
    for panel in found:
        assert panel["datasource"] == source, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == source, panel["title"]
            assert target["expr"].strip(), panel["title"]
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"] == source, variable["name"]


def test_the_panels_the_operator_needs_are_there() -> None:
    read = {m for _, expr in queries(load()) for m in references(expr).metrics}
    for metric in (
        "pipeline_jobs_started_total",
        "pipeline_jobs_succeeded_total",
        "pipeline_jobs_failed_total",
        "pipeline_job_duration_seconds_bucket",
        "pipeline_queue_depth",
        "pipeline_queue_oldest_job_age_seconds",
        "pipeline_retry_depth",
        "pipeline_deferred_depth",
        "pipeline_dead_letters_pending",
        "pipeline_worker_utilization_ratio",
        "pipeline_group_members",
        "pipeline_scheduler_release_lateness_seconds_bucket",
    ):
        assert metric in read, f"no panel shows {metric}"


def test_every_query_reads_exported_metrics_and_labels() -> None:
    problems = unknown_references(load())
    assert not problems, "\n".join(problems)


def test_every_query_parses(tmp_path: Path) -> None:
    complaints = unparsable(load(), tmp_path)
    assert not complaints, complaints


def broken(path: str, old: str, new: str) -> Dashboard:
    """A copy of the dashboard with ``old`` replaced by ``new`` in the first query having it."""
    dashboard = copy.deepcopy(load())
    for panel in panels(dashboard):
        for target in panel["targets"]:
            if old in target["expr"]:
                target["expr"] = target["expr"].replace(old, new)
                return dashboard
    raise AssertionError(f"no query has {old!r} ({path})")


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ("pipeline_queue_depth", "pipeline_queue_dept", "pipeline_queue_dept is not exported"),
        ("pipeline_job_duration_seconds_bucket", "pipeline_job_duration_seconds", "not exported"),
        ("by (priority) (pipeline_queue_depth", "by (prio) (pipeline_queue_depth", "['prio']"),
        (
            "pipeline_worker_utilization_ratio{",
            'pipeline_worker_utilization_ratio{pod="a", ',
            "['pod']",
        ),
    ],
)
def test_a_wrong_metric_or_label_is_caught(old: str, new: str, complaint: str) -> None:
    problems = unknown_references(broken("metrics", old, new))
    assert any(complaint in p for p in problems), problems


def test_an_unparsable_query_is_caught(tmp_path: Path) -> None:
    complaints = unparsable(broken("parse", "sum by (type) (", "sum by (type) ((("), tmp_path)
    assert "parse error" in complaints, complaints
