"""Fixtures of the whole suite: a real Kafka for the tests that ask for one, started lazily.

``bootstrap_servers`` uses ``PIPELINE_BOOTSTRAP_SERVERS`` when set, else starts one local node on
free ports with :func:`pipeline_cli.devbroker.up` (what ``pipeline dev up`` runs) for the session
(under pytest-xdist, a session is one worker process: each has its own node).
``secure_cluster`` starts a secured node of its own (``pipeline dev up --secure``: TLS, SCRAM,
ACLs) the first time a test asks for it, and ``secure_settings`` are its admin's settings.
A broker that cannot be reached or started fails the tests that need it; they are never skipped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from pipeline._settings import Settings
    from pipeline_cli.devbroker import DevCluster
    from tests.topicreaper import TopicReaper

TESTS = Path(__file__).parent
# Tests under these folders get these marks (chaos runs need a broker too, hence both).
_FOLDER_MARKS = {
    TESTS / "integration": ("kafka",),
    TESTS / "interop": ("kafka",),
    TESTS / "chaos": ("kafka", "chaos"),
}
_PORT_ATTEMPTS = 3
_reaper: TopicReaper | None = None
"""Deletes the topics of each test's ``namespace`` from the session's Kafka once it ended."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for folder, marks in _FOLDER_MARKS.items():
            if item.path.is_relative_to(folder):
                for mark in marks:
                    item.add_marker(mark)


def start_dev_cluster(
    nodes: int,
    data_dir: Path,
    timeout: float = 180.0,
    *,
    secure: bool = False,
    host: str | None = None,
) -> DevCluster:
    """Starts a local cluster in ``data_dir`` on free ports (brokers on ``host``, default
    localhost), or fails the test with the cause."""
    from pipeline_cli import devbroker

    problem: devbroker.DevBrokerError | None = None
    for _ in range(_PORT_ATTEMPTS):
        try:
            port = devbroker.free_base_port(nodes)
            return devbroker.up(nodes, data_dir, port, timeout=timeout, secure=secure, host=host)
        except devbroker.PortInUseError as exc:
            problem = exc  # a parallel test worker may take the ports after we looked: retry
        except devbroker.DevBrokerError as exc:
            problem = exc
            break
    pytest.fail(f"could not start a local Kafka for the tests: {problem}", pytrace=False)


def stop_dev_cluster(data_dir: Path) -> None:
    from pipeline_cli import devbroker

    try:
        devbroker.down(data_dir, timeout=30, hard=True)  # its data is deleted: no clean shutdown
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _check_answers(servers: str) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": servers, "log_level": 0}).list_topics(timeout=15)
    except KafkaException as exc:
        problem = exc
    else:
        return
    pytest.fail(
        f"PIPELINE_BOOTSTRAP_SERVERS={servers} did not answer a metadata request within 15 s "
        f"({problem}); start that Kafka, or unset the variable so the tests start their own",
        pytrace=False,
    )


def _wait_for_coordinators(
    servers: str, timeout: float = 90.0, client: dict[str, str] | None = None
) -> None:
    """Wait until the group and transaction coordinators answer.

    A new broker creates ``__consumer_offsets`` and ``__transaction_state`` on first use and
    answers NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS while it loads them; tests should
    start against a broker that is ready, whichever test happens to run first.
    """
    import time

    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    from tests.waiting import wait_for

    deadline = time.monotonic() + timeout
    conf = {**(client or {}), "bootstrap.servers": servers, "log_level": 0}
    consumer = Consumer({**conf, "group.id": f"pipeline-tests-{uuid.uuid4().hex[:8]}"})
    problems: list[KafkaException] = []

    def coordinator_answers() -> bool:
        try:
            consumer.committed([TopicPartition("pipeline-tests-warm-up", 0)], timeout=10)
        except KafkaException as exc:
            problems.append(exc)
            return False
        return True

    try:
        if not wait_for(coordinator_answers, timeout, interval=0.2):
            pytest.fail(f"Kafka at {servers} has no group coordinator: {problems[-1]}")
    finally:
        consumer.close()
    producer = Producer({**conf, "transactional.id": f"pipeline-tests-{uuid.uuid4().hex[:8]}"})
    try:
        producer.init_transactions(max(1.0, deadline - time.monotonic()))
    except KafkaException as exc:
        pytest.fail(f"Kafka at {servers} has no transaction coordinator: {exc}")


@pytest.fixture(scope="session")
def bootstrap_servers() -> Iterator[str]:
    """A Kafka for the session: ``PIPELINE_BOOTSTRAP_SERVERS``, else one local node."""
    if servers := os.environ.get("PIPELINE_BOOTSTRAP_SERVERS"):
        _check_answers(servers)
        _wait_for_coordinators(servers)
        with _reaping(servers):
            yield servers
        return
    data_dir = Path(tempfile.mkdtemp(prefix="pipeline-test-kafka-"))
    try:
        servers = start_dev_cluster(1, data_dir).bootstrap_servers
        _wait_for_coordinators(servers)
        with _reaping(servers):
            yield servers
    finally:
        stop_dev_cluster(data_dir)


@contextlib.contextmanager
def _reaping(servers: str) -> Iterator[None]:
    """While the block runs, the topics of each test's namespace are deleted from ``servers``
    once the test ended (see :mod:`tests.topicreaper`)."""
    from tests.topicreaper import TopicReaper

    global _reaper  # noqa: PLW0603 - one session's Kafka per process
    _reaper = TopicReaper(servers)
    try:
        yield
    finally:
        _reaper.close()
        _reaper = None


@pytest.fixture(scope="session")
def secure_cluster() -> Iterator[DevCluster]:
    """A secured local node for the session (``pipeline dev up --secure``), on free ports."""
    data_dir = Path(tempfile.mkdtemp(prefix="pipeline-test-secure-kafka-"))
    try:
        cluster = start_dev_cluster(1, data_dir, secure=True)
        _wait_for_coordinators(cluster.bootstrap_servers, client=cluster.security().librdkafka())
        yield cluster
    finally:
        stop_dev_cluster(data_dir)


@pytest.fixture
def secure_settings(secure_cluster: DevCluster, namespace: str) -> Settings:
    """The admin's settings for ``secure_cluster`` (a super user), in this test's namespace."""
    from pipeline._settings import Settings

    return Settings(
        bootstrap_servers=secure_cluster.bootstrap_servers,
        namespace=namespace,
        security=secure_cluster.security(),
    )


@pytest.fixture(autouse=True)
def _config_file_unchanged() -> Iterator[None]:
    """A service's ``--config PATH`` makes PATH the process's ``PIPELINE_CONFIG_FILE`` (for the
    application's ``Pipeline()`` too): a test that runs a service in this process leaves it
    set, and the settings of every later test would read that file."""
    before = os.environ.get("PIPELINE_CONFIG_FILE")
    yield
    if before is None:
        os.environ.pop("PIPELINE_CONFIG_FILE", None)
    else:
        os.environ["PIPELINE_CONFIG_FILE"] = before


@pytest.fixture
def namespace() -> Iterator[str]:
    """A topic namespace of this test alone, so tests never see each other's topics; its topics
    on the session's Kafka are deleted once the test is over."""
    name = f"t{uuid.uuid4().hex[:8]}"
    yield name
    if _reaper is not None:
        _reaper.reap(name)


@pytest.fixture
def settings(bootstrap_servers: str, namespace: str) -> Settings:
    from pipeline._settings import Settings

    return Settings(bootstrap_servers=bootstrap_servers, namespace=namespace)


@pytest.fixture(scope="module")
def dev_cluster_factory() -> Iterator[Callable[..., DevCluster]]:
    """``start(nodes=3, secure=False)`` starts an extra local cluster on free ports, removed
    after the module."""
    data_dirs: list[Path] = []

    def start(nodes: int = 3, *, timeout: float = 180.0, secure: bool = False) -> DevCluster:
        data_dirs.append(Path(tempfile.mkdtemp(prefix="pipeline-test-cluster-")))
        return start_dev_cluster(nodes, data_dirs[-1], timeout, secure=secure)

    try:
        yield start
    finally:
        for data_dir in data_dirs:
            stop_dev_cluster(data_dir)
