"""A broker outage and a namespace without topics, as a worker process sees and reports them."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipeline import Pipeline, Settings
from pipeline._admin import apply_topics
from pipeline_cli.devbroker import DevCluster

from .harness import Recording, WorkerLauncher, WorkerProcess, enqueue, wait_until
from .harness.metrics import free_port, health

UNHEALTHY_AFTER = {"PIPELINE_WORKER__UNHEALTHY_AFTER_S": "2"}
UNREACHABLE_FOR = re.compile(r"unreachable for (\d+)s")
OUTAGE_S = 30
"""How long the broker stays stopped under open transactions (as the worker measures it)."""


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[[Settings], tuple[WorkerLauncher, Recording]]]:
    """Launchers of workers on the recording app for any cluster; their workers are killed."""
    launchers: list[WorkerLauncher] = []

    def make(settings: Settings) -> tuple[WorkerLauncher, Recording]:
        recording = Recording(tmp_path / f"runs-{len(launchers)}.log")
        launchers.append(WorkerLauncher(settings, recording.path, tmp_path))
        return launchers[-1], recording

    try:
        yield make
    finally:
        for launcher in launchers:
            launcher.stop_all()


def unreachable_for(port: int) -> int:
    """Seconds Kafka has been unreachable by the worker's ``/healthz`` (-1: it does not say)."""
    answer = health(port)
    found = UNREACHABLE_FOR.search(answer[1]) if answer is not None else None
    return int(found.group(1)) if found is not None else -1


def closed_address() -> str:
    return f"127.0.0.1:{free_port()}"  # nothing listens there: every connection is refused


def test_an_unreachable_broker_is_one_log_line_and_healthz_503(
    namespace: str, launch: Callable[[Settings], tuple[WorkerLauncher, Recording]]
) -> None:
    servers = closed_address()
    launcher, _ = launch(Settings(bootstrap_servers=servers, namespace=namespace))
    port = free_port()
    worker = launcher.start("--metrics-port", str(port), env=UNHEALTHY_AFTER)
    wait_until(
        lambda: unreachable_for(port) >= 5,
        timeout=60,
        what=lambda: f"/healthz saying Kafka is unreachable for 5 s, got {health(port)}",
        watch=[worker],
    )
    answer = health(port)
    assert answer is not None
    assert answer[0] == 503
    assert f"Kafka at {servers} unreachable for" in answer[1]
    assert "Connection refused" in answer[1]
    # Alive all the same: the liveness probe does not restart it for what a restart cannot mend.
    assert health(port, "/livez") == (200, "ok\n")
    # librdkafka retried the connection ~100 times meanwhile, each with a log line before.
    lines = worker.log().splitlines()
    assert sum("unreachable since" in line for line in lines) == 1, worker.log_tail()
    assert len(lines) <= 5, worker.log_tail()


@pytest.mark.slow
def test_burst_gives_up_on_an_unreachable_broker_with_the_cause(
    namespace: str, launch: Callable[[Settings], tuple[WorkerLauncher, Recording]]
) -> None:
    servers = closed_address()
    launcher, _ = launch(Settings(bootstrap_servers=servers, namespace=namespace))
    worker = launcher.start("--burst", env=UNHEALTHY_AFTER)
    assert worker.wait(60) == 1, worker.log_tail()
    log = worker.log()
    assert f"burst: giving up: Kafka at {servers} unreachable for" in log
    assert "Connection refused" in log
    assert "Traceback" not in log


@pytest.mark.parametrize("burst", [True, False], ids=["burst", "service"])
def test_a_namespace_without_topics_names_the_topic_and_the_fix(
    settings: Settings,
    burst: bool,
    launch: Callable[[Settings], tuple[WorkerLauncher, Recording]],
) -> None:
    """The broker is up; the namespace's topics were never created."""
    launcher, _ = launch(settings)
    started = time.monotonic()
    worker = launcher.start(*(["--burst"] if burst else []))
    assert worker.wait(30) == 1, worker.log_tail()
    assert time.monotonic() - started < 15, worker.log_tail()
    log = worker.log()
    ns = settings.namespace
    assert f"topic {ns}.jobs.critical does not exist" in log
    assert f"{ns}.jobs.default" in log
    assert f"create the namespace's topics with `pipeline topics apply --namespace {ns}`" in log
    assert "Traceback" not in log


@pytest.mark.slow
def test_healthz_follows_the_broker_down_and_back(
    namespace: str,
    launch: Callable[[Settings], tuple[WorkerLauncher, Recording]],
    dev_cluster_factory: Callable[..., DevCluster],
) -> None:
    """A broker of its own, stopped and started again under a running worker."""
    cluster = dev_cluster_factory(1)
    settings = Settings(bootstrap_servers=cluster.bootstrap_servers, namespace=namespace)
    apply_topics(settings)
    launcher, recording = launch(settings)
    port = free_port()
    worker = launcher.start("--metrics-port", str(port), env=UNHEALTHY_AFTER)
    wait_until(
        lambda: "partitions assigned" in worker.log() and health(port) == (200, "ok\n"),
        timeout=60,
        what="the worker to own its partitions and answer /healthz with 200",
        watch=[worker],
    )
    # Running, not still restoring what it was assigned: a job has run.
    run_one_job(settings, recording, worker, "a job enqueued before the outage to run")
    cluster.stop_node(0)
    wait_until(
        lambda: unreachable_for(port) >= 2,
        timeout=60,
        what=lambda: f"/healthz saying Kafka is unreachable, got {health(port)}",
        watch=[worker],
    )
    answer = health(port)
    assert answer is not None
    assert answer[0] == 503
    cluster.start_node(0)
    wait_until(
        lambda: health(port) == (200, "ok\n"),
        timeout=120,
        what=lambda: f"/healthz answering 200 again, got {health(port)}",
        watch=[worker],
    )
    log = worker.log()
    assert log.count("unreachable since") == 1, worker.log_tail()
    assert log.count(f"Kafka at {cluster.bootstrap_servers} reachable again after") == 1
    during = log.split("unreachable since", 1)[1].split("reachable again after", 1)[0]
    assert len(during.splitlines()) <= 10, worker.log_tail()  # not one per reconnect attempt
    # And it works again: a job enqueued now runs.
    run_one_job(settings, recording, worker, "the job enqueued after the outage to run")


def run_one_job(settings: Settings, recording: Recording, worker: WorkerProcess, what: str) -> None:
    """Enqueue one job and wait until the worker ran it."""
    producer = Pipeline(settings)
    try:
        [job_id] = enqueue(producer, "noop", 1)
    finally:
        producer.close(30)
    wait_until(lambda: recording.all_finished([job_id]), timeout=60, what=what, watch=[worker])


@pytest.mark.slow
def test_jobs_run_again_after_the_broker_restarts_under_open_transactions(
    namespace: str,
    launch: Callable[[Settings], tuple[WorkerLauncher, Recording]],
    dev_cluster_factory: Callable[..., DevCluster],
) -> None:
    """Keyed jobs (each commit a transaction with their key records) and failing ones (moves
    to the retry tiers) before and after a 30 s stop of the broker. After the restart
    librdkafka sat in a ``send_offsets_to_transaction`` for good (its timeout unchecked), and
    with every slot held by a failed job waiting for its move, no job ran again until the
    worker was restarted. The call is given up on and the producer replaced."""
    cluster = dev_cluster_factory(1)
    settings = Settings(bootstrap_servers=cluster.bootstrap_servers, namespace=namespace)
    apply_topics(settings)
    launcher, recording = launch(settings)
    port = free_port()
    worker = launcher.start("--metrics-port", str(port), env=UNHEALTHY_AFTER)
    producer = Pipeline(settings)
    keyed: list[str] = []

    def rounds(first: int, count: int) -> None:
        for n in range(first, first + count * 20, 20):
            keyed.extend(
                producer.enqueue("noop", {"n": n + i}, idempotency_key=f"key-{n + i}")
                for i in range(20)
            )
            enqueue(producer, "twice", 4, first=n)  # two runs, then dead-lettered: moves

    try:
        rounds(0, 10)
        wait_until(
            lambda: recording.all_finished(keyed), timeout=60, what="the jobs before the stop",
            watch=[worker],
        )  # fmt: skip
        cluster.stop_node(0)
        # The outage lasts until the worker itself has seen Kafka unreachable for 30 s.
        wait_until(
            lambda: unreachable_for(port) >= OUTAGE_S,
            timeout=OUTAGE_S + 60,
            what=lambda: f"/healthz saying Kafka is unreachable for {OUTAGE_S}s: {health(port)}",
            watch=[worker],
        )
        cluster.start_node(0)
        rounds(1000, 20)
        wait_until(
            lambda: recording.all_finished(keyed),
            timeout=180,
            what=lambda: (
                f"every keyed job to run, {len(set(keyed) - recording.finished_ids)} did not"
            ),
            watch=[worker],
        )
    finally:
        producer.close(30)
    assert "Traceback" not in worker.log(), worker.log_tail()
