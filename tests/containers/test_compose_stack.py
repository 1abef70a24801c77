"""docker-compose.yml brought up for real on Podman, and jobs run through it.

The project's image is built from its Dockerfile; Kafka and Prometheus run from local stand-ins
for their Docker Hub images (``ops/containers/``), Grafana stays down (no source for its image
here). The real Docker Compose drives Podman's Docker API: ``--scale``, ``deploy.replicas``,
``condition: service_healthy`` / ``service_completed_successfully`` and ``--wait`` as written.
``make test-containers``; the first run builds the images (about five minutes).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ops.containers.engine import ROOT, ComposeStack, EngineError, Podman
from ops.containers.images import build_all

from tests.waiting import wait_for

pytestmark = pytest.mark.containers

PROJECT = "kafka-pipeline-test"
HOST_PORTS = {"kafka": 9094, "prometheus": 9090}
"""What docker-compose.yml publishes on the host, for clients there."""
PROMETHEUS = f"http://localhost:{HOST_PORTS['prometheus']}"
WORKERS = 2


def _host_env() -> dict[str, str]:
    """A client on the host, as docker-compose.yml's header says: Kafka on localhost:9094."""
    return {
        **os.environ,
        "PIPELINE_BOOTSTRAP_SERVERS": f"localhost:{HOST_PORTS['kafka']}",
        "PIPELINE_NAMESPACE": "pipeline",
    }


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def stack() -> Iterator[ComposeStack]:
    busy = [f"{name} ({port})" for name, port in HOST_PORTS.items() if _port_in_use(port)]
    if busy:
        pytest.fail(f"host ports in use: {', '.join(busy)}; stop what listens there", pytrace=False)
    try:
        with Podman() as podman:
            build_all(podman, lambda line: print(line, file=sys.stderr))
            with ComposeStack(podman, PROJECT) as running:
                running.compose("down", "--volumes", "--timeout", "5", timeout=180, check=False)
                try:
                    running.compose(
                        "up", "--detach", "--wait", "--wait-timeout", "300",
                        "--scale", f"worker={WORKERS}",
                        timeout=600,
                    )  # fmt: skip
                    yield running
                except EngineError:
                    logs = running.compose("logs", "--tail", "20", timeout=120, check=False)
                    print(logs.stdout[-6000:], file=sys.stderr)
                    raise
                finally:
                    running.compose(
                        "down", "--volumes", "--remove-orphans", "--timeout", "45",
                        timeout=600, check=False,
                    )  # fmt: skip
    except EngineError as exc:
        pytest.fail(str(exc), pytrace=False)


def _by_service(stack: ComposeStack) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for container in stack.containers():
        found.setdefault(str(container["Service"]), []).append(container)
    return found


def _prometheus(path: str, **params: str) -> Any:
    url = f"{PROMETHEUS}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def test_every_service_is_up_and_healthy_and_the_topics_job_exited_0(stack: ComposeStack) -> None:
    services = _by_service(stack)
    healthy = {"kafka": 1, "worker": WORKERS, "scheduler": 2, "exporter": 1}
    for service, count in healthy.items():
        states = [(c["State"], c["Health"]) for c in services.get(service, [])]
        assert states == [("running", "healthy")] * count, service
    assert [(c["State"], c["ExitCode"]) for c in services["topics"]] == [("exited", 0)]
    assert [c["State"] for c in services["prometheus"]] == ["running"]
    assert "grafana" not in services  # behind a profile in the stand-ins file


def test_the_image_runs_the_console_scripts_as_a_non_root_user(stack: ComposeStack) -> None:
    uid = stack.compose("exec", "-T", "exporter", "id", "-u", timeout=60).stdout.strip()
    assert uid not in {"", "0"}
    # PID 1 is the console script itself (no shell, no wrapper), so it gets compose's SIGTERM.
    cmdline = stack.compose("exec", "-T", "worker", "cat", "/proc/1/cmdline", timeout=60).stdout
    script, *args = cmdline.rstrip("\0").split("\0")[1:]
    assert (Path(script).name, args) == ("pipeline-worker", ["--app", "examples.app"])


def test_status_on_the_host_sees_both_workers_and_a_scheduler_leader(stack: ComposeStack) -> None:
    command = [str(Path(sys.executable).with_name("pipeline")), "status", "--json"]

    def status() -> dict[str, Any]:
        out = subprocess.run(
            command, env=_host_env(), capture_output=True, text=True, timeout=60, check=True
        )
        parsed: dict[str, Any] = json.loads(out.stdout)
        return parsed

    def settled() -> bool:
        found = status()
        return len(found["workers"]["members"]) == WORKERS and found["workers"]["state"] == "STABLE"

    assert wait_for(settled, timeout=60, interval=1.0), status()["workers"]
    found = status()
    owned = [p for member in found["workers"]["members"] for p in member["partitions"]]
    assert len(owned) == len(set(owned)) == 4 * 6  # every partition of the 4 priority topics
    scheduler = found["scheduler"]
    assert scheduler["leader"] is not None
    assert len(scheduler["members"]) == 2


def test_prometheus_scrapes_every_container_and_loads_the_alert_rules(stack: ComposeStack) -> None:
    jobs = {"pipeline-worker": WORKERS, "pipeline-scheduler": 2, "pipeline-exporter": 1}
    expected = Counter(jobs)

    def up() -> Counter[str]:
        targets = _prometheus("/api/v1/targets")["activeTargets"]
        return Counter(t["labels"]["job"] for t in targets if t["health"] == "up")

    assert wait_for(lambda: up() >= expected, timeout=90, interval=2.0), up()
    rules = yaml.safe_load((ROOT / "ops" / "prometheus" / "alerts.yml").read_text())
    written = {r["alert"] for group in rules["groups"] for r in group["rules"]}
    groups = _prometheus("/api/v1/rules")["groups"]
    assert {r["name"] for group in groups for r in group["rules"]} == written


def test_jobs_enqueued_on_the_host_run_in_the_worker_containers(stack: ComposeStack) -> None:
    # examples.app's own enqueue: 8 emails, 6 thumbnails, 4 reports, one email delayed by 30 s.
    script = "from examples.app import app, enqueue_examples; enqueue_examples(); app.flush(30)"
    subprocess.run(
        [sys.executable, "-c", script], env=_host_env(), cwd=ROOT, timeout=120, check=True
    )
    expected = {"email.send": 9, "thumbnail.make": 6, "report.build": 4}
    query = "sum by (type) (pipeline_jobs_succeeded_total)"

    def succeeded() -> dict[str, int]:
        result = _prometheus("/api/v1/query", query=query)["result"]
        return {r["metric"]["type"]: int(float(r["value"][1])) for r in result}

    # The delayed email goes through the scheduler container; Prometheus scrapes every 15 s.
    assert wait_for(lambda: succeeded() == expected, timeout=150, interval=3.0), succeeded()


def test_compose_stop_drains_the_workers_and_they_exit_0(stack: ComposeStack) -> None:
    stack.compose("stop", "--timeout", "45", "worker", timeout=180)
    workers = _by_service(stack)["worker"]
    assert [(c["State"], c["ExitCode"]) for c in workers] == [("exited", 0)] * WORKERS
