"""ops/k8s: rendered with the real kustomize, validated against the Kubernetes schemas
(kubernetes-validate) and KEDA's own CRD schemas, and held to the invariants of k8s_checks."""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from . import k8s_checks
from .checks import setting_problems
from .k8s_checks import EXPORTER, SCHEDULER, WORKER, Manifest, containers, find, only_container
from .tools import K8S, KUBERNETES_VERSIONS, OVERLAYS, ROOT, keda_crd_schemas, render

KEDA_KINDS = ("ScaledObject", "TriggerAuthentication")
SECRET_EXAMPLE = K8S / "base" / "kafka-credentials.example.yaml"
_RENDERED: dict[str, list[Manifest]] = {}


def rendered(overlay: str) -> list[Manifest]:
    if overlay not in _RENDERED:
        _RENDERED[overlay] = render(K8S / "overlays" / overlay)
    return copy.deepcopy(_RENDERED[overlay])


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the schema does not declare (jsonschema alone allows them; the API server
    would prune them, silently dropping a typo)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(obj, dict) and "properties" in schema:
        found = []
        for key, value in obj.items():
            if key in schema["properties"]:
                found += unknown_fields(value, schema["properties"][key], f"{path}.{key}")
            elif not schema.get("additionalProperties"):
                found.append(f"{path}.{key}")
        return found
    if isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        return [
            hit
            for key, value in obj.items()
            for hit in unknown_fields(value, schema["additionalProperties"], f"{path}.{key}")
        ]
    if isinstance(obj, list) and "items" in schema:
        return [
            hit
            for index, item in enumerate(obj)
            for hit in unknown_fields(item, schema["items"], f"{path}[{index}]")
        ]
    return []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_matches_the_kubernetes_schemas(overlay: str) -> None:
    objects = rendered(overlay)
    core = [obj for obj in objects if obj["kind"] not in KEDA_KINDS]
    assert {obj["kind"] for obj in core} >= {"ConfigMap", "Deployment", "Job"}
    for obj in [*core, yaml.safe_load(SECRET_EXAMPLE.read_text())]:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_objects_match_kedas_crd_schemas(overlay: str) -> None:
    schemas = keda_crd_schemas()
    keda = [obj for obj in rendered(overlay) if obj["kind"] in KEDA_KINDS]
    assert "ScaledObject" in {obj["kind"] for obj in keda}
    for obj in keda:
        schema = schemas[obj["kind"]]
        jsonschema.validate(obj, schema)
        assert unknown_fields(obj, schema) == [], obj["kind"]


def test_the_schema_checks_refuse_a_misspelt_field() -> None:
    objects = rendered("dev")
    worker = find(objects, "Deployment", WORKER)
    worker["spec"]["template"]["spec"]["terminationGracePeriod"] = 55
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, KUBERNETES_VERSIONS[-1], strict=True)
    scaled = find(objects, "ScaledObject", WORKER)
    scaled["spec"]["maxReplicas"] = 3
    assert unknown_fields(scaled, keda_crd_schemas()["ScaledObject"]) == [".spec.maxReplicas"]
    scaled["spec"]["maxReplicaCount"] = "three"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, keda_crd_schemas()["ScaledObject"])


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("check", k8s_checks.ALL_CHECKS, ids=lambda check: check.__name__)
def test_invariant_holds(overlay: str, check: Callable[[list[Manifest]], list[str]]) -> None:
    assert check(rendered(overlay)) == []


def _set_setting(objects: list[Manifest], name: str, value: str) -> None:
    find(objects, "ConfigMap", "pipeline-settings")["data"][name] = value


def test_each_invariant_catches_a_broken_copy() -> None:
    """Every check fails on a copy of the dev overlay broken in the way it guards against."""
    broken = rendered("dev")
    find(broken, "Deployment", WORKER)["spec"]["template"]["metadata"]["labels"] = {"a": "b"}
    assert "selector" in " ".join(k8s_checks.selector_problems(broken))

    broken = rendered("dev")
    _set_setting(broken, "PIPELINE_WORKER__CONCURENCY", "8")
    assert "'concurency' is no setting of WorkerSettings" in " ".join(
        k8s_checks.env_problems(broken)
    )
    broken = rendered("dev")
    _set_setting(broken, "PIPELINE_BOOTSTRAP_SERVER", "kafka:9092")
    assert "'bootstrap_server' is no setting of Settings" in " ".join(
        k8s_checks.env_problems(broken)
    )
    broken = rendered("dev")
    _set_setting(broken, "PIPELINE_WORKER__CONCURRENCY", "none")
    assert "worker.concurrency" in " ".join(k8s_checks.env_problems(broken))

    broken = rendered("dev")
    find(broken, "ScaledObject", WORKER)["spec"]["maxReplicaCount"] = 4  # 3 partitions
    assert "maxReplicaCount 4 <= partitions 3" in " ".join(k8s_checks.replica_problems(broken))
    broken = rendered("dev")
    find(broken, "Deployment", WORKER)["spec"]["replicas"] = 5
    assert "5 replicas for 3 partitions" in " ".join(k8s_checks.replica_problems(broken))

    broken = rendered("dev")
    _set_setting(broken, "PIPELINE_WORKER__SHUTDOWN_TIMEOUT_S", "60")
    assert "terminationGracePeriodSeconds 55 must exceed" in " ".join(
        k8s_checks.grace_problems(broken)
    )

    broken = rendered("dev")
    find(broken, "ScaledObject", WORKER)["spec"]["cooldownPeriod"] = 60
    assert "cooldownPeriod 60 has no effect with minReplicaCount 1" in " ".join(
        k8s_checks.scale_down_problems(broken)
    )
    broken = rendered("dev")
    find(broken, "ScaledObject", WORKER)["spec"]["minReplicaCount"] = 0
    find(broken, "ScaledObject", WORKER)["spec"]["cooldownPeriod"] = 60
    assert k8s_checks.scale_down_problems(broken) == []

    broken = rendered("dev")
    _set_setting(broken, "PIPELINE_NAMESPACE", "billing")
    problems = " ".join(k8s_checks.keda_problems(broken))
    assert "group pipeline.workers" in problems
    assert "billing.jobs.high" in problems
    broken = rendered("dev")  # a name the scaler resolves in KEDA's namespace, not the workers'
    _set_setting(broken, "PIPELINE_BOOTSTRAP_SERVERS", "kafka:9092")
    for trigger in find(broken, "ScaledObject", WORKER)["spec"]["triggers"]:
        trigger["metadata"]["bootstrapServers"] = "kafka:9092"
    assert "trigger lag-high: kafka:9092 is not fully qualified" in " ".join(
        k8s_checks.keda_problems(broken)
    )


def test_the_probe_check_catches_a_broken_probe() -> None:
    broken = rendered("dev")
    _set_setting(broken, "PIPELINE_WORKER__METRICS_PORT", "9000")
    assert "not /livez on the metrics port 9000" in " ".join(k8s_checks.probe_problems(broken))
    for name in (WORKER, SCHEDULER):  # restarted in a loop through a Kafka outage
        broken = rendered("dev")
        container = only_container(find(broken, "Deployment", name))
        container["livenessProbe"]["httpGet"]["path"] = "/healthz"
        assert f"{name}: livenessProbe asks /healthz on port" in " ".join(
            k8s_checks.probe_problems(broken)
        )
        del container["readinessProbe"]
        assert f"{name}: no readinessProbe" in k8s_checks.probe_problems(broken)
    broken = rendered("dev")
    command = only_container(find(broken, "Deployment", EXPORTER))["command"]
    command[command.index("--metrics-port") + 1] = "9003"
    assert "pipeline-exporter: livenessProbe asks /livez on port 8002" in " ".join(
        k8s_checks.probe_problems(broken)
    )
    broken = rendered("dev")  # restarted whenever Kafka is unreachable
    exporter = only_container(find(broken, "Deployment", EXPORTER))
    exporter["livenessProbe"]["httpGet"]["path"] = "/healthz"
    assert "pipeline-exporter: livenessProbe asks /healthz on port 8002, not /livez" in " ".join(
        k8s_checks.probe_problems(broken)
    )
    del exporter["readinessProbe"]
    assert "pipeline-exporter: no readinessProbe" in k8s_checks.probe_problems(broken)


def test_the_workers_drain_before_the_kubelet_kills_them() -> None:
    worker = find(rendered("production"), "Deployment", WORKER)
    container = only_container(worker)
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 55


def test_the_dev_overlay_scales_down_after_a_minute() -> None:
    """Its shorter scale-down wait is the HPA's window (KEDA's cooldownPeriod would not act:
    the workers never scale to zero); production keeps the base's five minutes."""
    assert k8s_checks.scale_down_window(rendered("dev")) == 60
    assert k8s_checks.scale_down_window(rendered("production")) == 300


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_commands_are_the_console_scripts(overlay: str) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    objects = rendered(overlay)
    commands = {
        workload["metadata"]["name"]: container["command"]
        for workload, container in containers(objects)
    }
    assert {command[0] for command in commands.values()} <= set(scripts)
    assert commands["pipeline-topics"][:3] == ["pipeline", "topics", "apply"]
    assert commands[WORKER][0] == "pipeline-worker"
    assert commands[SCHEDULER][0] == "pipeline-scheduler"
    assert commands[EXPORTER][:2] == ["pipeline", "exporter"]
    assert find(objects, "Deployment", EXPORTER)["spec"]["replicas"] == 1


def test_the_secret_example_holds_real_settings_that_production_reads() -> None:
    secret = yaml.safe_load(SECRET_EXAMPLE.read_text())
    keys = secret["stringData"]
    assert setting_problems({**keys, "PIPELINE_SECURITY__PROTOCOL": "SASL_SSL"}) == []
    objects = rendered("production")
    for _, container in containers(objects):
        refs = [s["secretRef"]["name"] for s in container["envFrom"] if "secretRef" in s]
        assert refs == [secret["metadata"]["name"]]
    auth = find(objects, "TriggerAuthentication", "pipeline-kafka")["spec"]["secretTargetRef"]
    assert {ref["name"] for ref in auth} == {secret["metadata"]["name"]}
    assert {ref["key"] for ref in auth} <= set(keys)
