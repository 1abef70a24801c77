"""The invariants of the rendered Kubernetes manifests, each a function listing what is wrong."""

from __future__ import annotations

from typing import Any

from pipeline._topics import TopicNames
from pipeline_worker._runtime import EXIT_S
from pipeline_worker.intake.shutdown import FINAL_COMMIT_S

from .checks import env_of, matches, setting_problems, settings_from

Manifest = dict[str, Any]
WORKER = "pipeline-worker"
SCHEDULER = "pipeline-scheduler"
EXPORTER = "pipeline-exporter"
WORKLOADS = ("Deployment", "Job")


def find(objects: list[Manifest], kind: str, name: str) -> Manifest:
    for obj in objects:
        if obj["kind"] == kind and obj["metadata"]["name"] == name:
            return obj
    raise AssertionError(f"no {kind} {name} in the rendered manifests")


def containers(objects: list[Manifest]) -> list[tuple[Manifest, Manifest]]:
    """(workload, container) for every container of every Deployment and Job."""
    return [
        (obj, container)
        for obj in objects
        if obj["kind"] in WORKLOADS
        for container in obj["spec"]["template"]["spec"]["containers"]
    ]


def only_container(deployment: Manifest) -> Manifest:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    result: Manifest = container
    return result


def selector_problems(objects: list[Manifest]) -> list[str]:
    problems = []
    for obj in objects:
        name = f"{obj['kind']} {obj['metadata']['name']}"
        if obj["kind"] == "Deployment":
            selector = obj["spec"]["selector"]["matchLabels"]
            labels = obj["spec"]["template"]["metadata"]["labels"]
            if not matches(selector, labels):
                problems.append(f"{name}: selector {selector} does not match its pods {labels}")
        if obj["kind"] == "PodDisruptionBudget":
            selector = obj["spec"]["selector"]["matchLabels"]
            pods = [
                o
                for o in objects
                if o["kind"] == "Deployment"
                and matches(selector, o["spec"]["template"]["metadata"]["labels"])
            ]
            if not pods:
                problems.append(f"{name}: selector {selector} matches no Deployment's pods")
        if obj["kind"] == "ScaledObject":
            target = obj["spec"]["scaleTargetRef"]
            names = {o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"}
            if target.get("kind", "Deployment") != "Deployment" or target["name"] not in names:
                problems.append(f"{name}: scales {target}, which is not rendered")
    return problems


def env_problems(objects: list[Manifest]) -> list[str]:
    problems = []
    for workload, container in containers(objects):
        where = f"{workload['metadata']['name']}/{container['name']}"
        env = env_of(container, objects)
        from_secrets = {
            item["name"]: "x" for item in container.get("env", []) if "valueFrom" in item
        }
        problems += [f"{where}: {p}" for p in setting_problems({**env, **from_secrets})]
    return problems


def _port(container: Manifest, port: int | str) -> int | None:
    if isinstance(port, int):
        return port
    for item in container.get("ports", []):
        if item.get("name") == port:
            number: int = item["containerPort"]
            return number
    return None


def _command_port(container: Manifest) -> int | None:
    """The exporter's metrics port: its ``--metrics-port`` option (not a setting)."""
    command: list[str] = container.get("command", [])
    if "--metrics-port" not in command:
        return None
    return int(command[command.index("--metrics-port") + 1])


_PROBE_PATHS = {"livenessProbe": "/livez", "startupProbe": "/livez", "readinessProbe": "/healthz"}
"""/healthz fails while Kafka is unreachable, which a restart does not mend: it is each
process's readiness, and /livez (its loops turn) its startup and liveness probes."""


def probe_problems(objects: list[Manifest]) -> list[str]:
    problems = []
    for name, section in ((WORKER, "worker"), (SCHEDULER, "scheduler"), (EXPORTER, None)):
        deployment = find(objects, "Deployment", name)
        container = only_container(deployment)
        if section is None:
            metrics_port = _command_port(container)
            if metrics_port is None:
                problems.append(f"{name}: no --metrics-port in its command")
        else:
            settings = settings_from(env_of(container, objects))
            metrics_port = getattr(settings, section).metrics_port
            if metrics_port is None:
                problems.append(f"{name}: PIPELINE_{section.upper()}__METRICS_PORT is not set")
        for kind, wanted in _PROBE_PATHS.items():
            probe = container.get(kind)
            if probe is None:
                if kind != "startupProbe":
                    problems.append(f"{name}: no {kind}")
                continue
            get = probe.get("httpGet", {})
            port = _port(container, get.get("port", ""))
            if get.get("path") != wanted or port != metrics_port:
                problems.append(
                    f"{name}: {kind} asks {get.get('path')} on port {port}, "
                    f"not {wanted} on the metrics port {metrics_port}"
                )
        annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
        scrape_port = annotations.get("prometheus.io/port")
        if scrape_port is not None and int(scrape_port) != metrics_port:
            problems.append(f"{name}: scraped on {scrape_port}, metrics on {metrics_port}")
    return problems


def replica_problems(objects: list[Manifest]) -> list[str]:
    worker = find(objects, "Deployment", WORKER)
    settings = settings_from(env_of(only_container(worker), objects))
    partitions = settings.topics.partitions
    problems = []
    replicas = worker["spec"].get("replicas", 1)
    if replicas > partitions:
        problems.append(f"{WORKER}: {replicas} replicas for {partitions} partitions")
    scaled = find(objects, "ScaledObject", WORKER)["spec"]
    low, high = scaled.get("minReplicaCount", 0), scaled.get("maxReplicaCount", 100)
    if not low <= replicas <= high <= partitions:
        problems.append(
            f"ScaledObject {WORKER}: needs minReplicaCount {low} <= replicas {replicas} <= "
            f"maxReplicaCount {high} <= partitions {partitions}"
        )
    scheduler = find(objects, "Deployment", SCHEDULER)
    if scheduler["spec"].get("replicas", 1) != 2:
        problems.append(f"{SCHEDULER}: a leader and one standby need replicas: 2")
    budget = find(objects, "PodDisruptionBudget", SCHEDULER)["spec"]
    if budget.get("minAvailable") != 1:
        problems.append(f"PodDisruptionBudget {SCHEDULER}: minAvailable must be 1")
    return problems


def _prestop_seconds(container: Manifest) -> float:
    hook = container.get("lifecycle", {}).get("preStop")
    if hook is None:
        return 0.0
    if "sleep" in hook:
        return float(hook["sleep"]["seconds"])
    command = hook.get("exec", {}).get("command", [])
    if len(command) == 2 and command[0] == "sleep":
        return float(command[1])
    raise AssertionError(f"preStop {hook}: only `sleep N` is understood by this check")


def grace_problems(objects: list[Manifest]) -> list[str]:
    worker = find(objects, "Deployment", WORKER)
    container = only_container(worker)
    drain = settings_from(env_of(container, objects)).worker.shutdown_timeout_s
    prestop = _prestop_seconds(container)
    grace = worker["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    needed = prestop + drain + FINAL_COMMIT_S + EXIT_S
    if prestop <= 0:
        return [f"{WORKER}: no preStop pause"]
    if not needed < grace:
        return [
            f"{WORKER}: terminationGracePeriodSeconds {grace} must exceed preStop {prestop:g} s "
            f"+ shutdown_timeout_s {drain:g} s + the final commit's {FINAL_COMMIT_S:g} s "
            f"+ the rest of the stop's {EXIT_S:g} s"
        ]
    return []


def keda_problems(objects: list[Manifest]) -> list[str]:
    """The ScaledObject watches the workers' own group on every priority topic they consume,
    on the brokers they use."""
    worker = find(objects, "Deployment", WORKER)
    settings = settings_from(env_of(only_container(worker), objects))
    group = settings.worker.group_id or f"{settings.namespace}.workers"
    names = TopicNames(settings.namespace)
    wanted = {names.jobs(priority) for priority in settings.worker.priorities}
    triggers = find(objects, "ScaledObject", WORKER)["spec"]["triggers"]
    problems = []
    topics = set()
    for trigger in triggers:
        meta = trigger.get("metadata", {})
        if trigger["type"] != "kafka":
            problems.append(f"trigger {trigger.get('name')}: type {trigger['type']}, not kafka")
            continue
        topics.add(meta.get("topic"))
        if meta.get("consumerGroup") != group:
            problems.append(f"trigger {trigger.get('name')}: group {meta.get('consumerGroup')}")
        short = [
            host
            for host in str(meta.get("bootstrapServers", "")).split(",")
            if ".svc" not in host.rsplit(":", 1)[0]
        ]
        if short:
            problems.append(
                f"trigger {trigger.get('name')}: {','.join(short)} is not fully qualified "
                "(<service>.<namespace>.svc...): KEDA resolves it in its own namespace"
            )
        if meta.get("bootstrapServers") != settings.bootstrap_servers:
            problems.append(
                f"trigger {trigger.get('name')}: brokers {meta.get('bootstrapServers')}, "
                f"the workers use {settings.bootstrap_servers}"
            )
        secured = settings.security.protocol.startswith("SASL")
        if secured != ("authenticationRef" in trigger and "sasl" in meta):
            problems.append(f"trigger {trigger.get('name')}: SASL differs from the workers'")
    if topics != wanted:
        problems.append(f"the triggers watch {sorted(topics)}, the workers read {sorted(wanted)}")
    return problems


def scale_down_problems(objects: list[Manifest]) -> list[str]:
    """The workers' scale-down is paced by the HPA's stabilization window. KEDA's
    ``cooldownPeriod`` only delays a scale to zero (``minReplicaCount`` 0, or an
    ``idleReplicaCount``): on a ScaledObject that never goes below one replica it does nothing,
    and setting it there suggests a pace that does not happen."""
    scaled = find(objects, "ScaledObject", WORKER)["spec"]
    problems = []
    to_zero = scaled.get("minReplicaCount", 0) == 0 or "idleReplicaCount" in scaled
    if "cooldownPeriod" in scaled and not to_zero:
        problems.append(
            f"ScaledObject {WORKER}: cooldownPeriod {scaled['cooldownPeriod']} has no effect "
            f"with minReplicaCount {scaled.get('minReplicaCount')} (KEDA uses it only to scale "
            "to zero); pace the scale-down with the HPA's scaleDown.stabilizationWindowSeconds"
        )
    hpa = scaled.get("advanced", {}).get("horizontalPodAutoscalerConfig", {})
    window = hpa.get("behavior", {}).get("scaleDown", {}).get("stabilizationWindowSeconds")
    if window is None:
        problems.append(f"ScaledObject {WORKER}: no scaleDown.stabilizationWindowSeconds")
    return problems


def scale_down_window(objects: list[Manifest]) -> int:
    """The seconds the HPA waits before it scales the workers down."""
    scaled = find(objects, "ScaledObject", WORKER)["spec"]
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    window: int = behavior["scaleDown"]["stabilizationWindowSeconds"]
    return window


ALL_CHECKS = (
    selector_problems,
    env_problems,
    probe_problems,
    replica_problems,
    grace_problems,
    keda_problems,
    scale_down_problems,
)
