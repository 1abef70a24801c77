"""The outbox end to end: business transactions, relays, a real Kafka and real workers.

Every committed job runs once, no rolled-back one ever runs, whatever happens to the relay
(SIGKILLed in the middle of publishing, then restarted; or its standby taking over) and even
when Kafka was down while the jobs were committed.
"""

from __future__ import annotations

import base64
import logging
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline import Pipeline, Settings
from pipeline._admin import apply_topics
from pipeline.outbox import OutboxRelay, RelayOptions, connect, create_table
from pipeline.outbox._dialect import Dialect
from tests.conftest import start_dev_cluster, stop_dev_cluster
from tests.waiting import wait_for

from ..worker.harness import Recording, WorkerLauncher, check_ran, wait_until
from .relays import (
    RelayLauncher,
    assert_published_once,
    pending,
    read_topic,
    relay_in_thread,
    write_orders,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pipeline_cli.devbroker import DevCluster

RELAY_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def stoppable_kafka() -> Iterator[DevCluster]:
    """A broker of this module's own, which its tests stop and start (left running)."""
    data_dir = Path(tempfile.mkdtemp(prefix="pipeline-test-outbox-kafka-"))
    try:
        yield start_dev_cluster(1, data_dir)
    finally:
        stop_dev_cluster(data_dir)


@pytest.mark.slow
def test_jobs_committed_while_kafka_is_down_run_once_across_a_relay_crash(
    stoppable_kafka: DevCluster, postgres_dsn: str, namespace: str, tmp_path: Path
) -> None:
    cluster = stoppable_kafka
    cluster.start_node(0)  # should a test before have left it stopped
    settings = Settings(bootstrap_servers=cluster.bootstrap_servers, namespace=namespace)
    apply_topics(settings)
    cluster.stop_node(0)

    # Kafka is down: the service commits its orders and their jobs all the same.
    written = write_orders(Pipeline(settings), postgres_dsn, 10_000)
    assert (len(written.committed), len(written.rolled_back)) == (8_000, 2_000)
    assert pending(postgres_dsn) == 8_000

    relays = RelayLauncher(settings, tmp_path)
    workers = WorkerLauncher(settings, tmp_path / "runs.log", tmp_path)
    try:
        first = relays.start(postgres_dsn, "--batch-size", "200")
        wait_until(
            lambda: "unreachable" in first.log(),
            timeout=60,
            what="the relay to say that Kafka is unreachable",
            watch=[first],
        )
        assert pending(postgres_dsn) == 8_000  # nothing is lost while it waits
        cluster.start_node(0)
        workers.start()

        # SIGKILL the relay while it publishes: some rows are out, others not yet.
        assert wait_for(lambda: pending(postgres_dsn) < 6_000, 90, interval=0.01), first.log_tail()
        first.kill()
        left = pending(postgres_dsn)
        assert 0 < left < 6_000, "the relay had published everything before it was killed"

        second = relays.start(postgres_dsn, "--batch-size", "200")
        wait_until(
            lambda: pending(postgres_dsn) == 0,
            timeout=RELAY_TIMEOUT_S,
            what="the restarted relay to publish the rest",
            watch=[second],
        )
        recording = Recording(tmp_path / "runs.log")
        wait_until(
            lambda: recording.all_finished(written.committed),
            timeout=RELAY_TIMEOUT_S,
            what=lambda: f"{len(recording.finished_ids)} of 8000 jobs to finish",
            watch=workers.started,
        )
        # check_ran also reports any run of a job nobody committed (a rolled-back one).
        assert check_ran(recording, written.committed, exactly_once=True) == []
        assert not set(written.rolled_back) & set(recording.run_counts())
    finally:
        relays.stop_all()
        workers.stop_all()


@pytest.mark.slow
def test_kafka_stopping_while_the_relay_publishes_loses_and_doubles_nothing(
    stoppable_kafka: DevCluster, sqlite_dsn: str, namespace: str, tmp_path: Path
) -> None:
    cluster = stoppable_kafka
    cluster.start_node(0)  # should a test before have left it stopped
    settings = Settings(bootstrap_servers=cluster.bootstrap_servers, namespace=namespace)
    apply_topics(settings)
    app = Pipeline(settings)
    written = write_orders(app, sqlite_dsn, 4_000)
    relays = RelayLauncher(settings, tmp_path)
    try:
        relay = relays.start(sqlite_dsn, "--batch-size", "50")
        assert wait_for(lambda: pending(sqlite_dsn) < 2_800, 90, interval=0.01), relay.log_tail()
        cluster.stop_node(0)
        more = write_orders(app, sqlite_dsn, 1_000, start=4_000)  # while Kafka is down
        wait_until(
            lambda: "Kafka has not taken the batch" in relay.log(),
            timeout=60,
            what="the relay to say that Kafka holds up a batch",
            watch=[relay],
        )
        assert pending(sqlite_dsn) > 0
        cluster.start_node(0)
        wait_until(
            lambda: pending(sqlite_dsn) == 0,
            timeout=RELAY_TIMEOUT_S,
            what="the relay to publish the rest once Kafka is back",
            watch=[relay],
        )
    finally:
        relays.stop_all()
    # What the topic holds, read to its end: every committed job once, nothing else.
    records = read_topic(settings, f"{settings.namespace}.jobs.default")
    published = Counter(app.codec.decode(record.value() or b"").id for record in records)
    assert sorted(published) == sorted(written.committed + more.committed)
    assert set(published.values()) == {1}, "a row was published twice"


def test_a_standby_takes_over_from_a_killed_relay(
    outbox_dsn: str, settings: Settings, relays: RelayLauncher, tmp_path: Path
) -> None:
    apply_topics(settings)
    connect(outbox_dsn)[0].close()  # the service's database (a relay opens an existing one)
    active = relays.start(outbox_dsn, "--batch-size", "100")
    wait_until(lambda: "active" in active.log(), timeout=60, what="the first relay to be active")
    standby = relays.start(outbox_dsn, "--batch-size", "100")
    wait_until(
        lambda: "standby" in standby.log(), timeout=60, what="the second relay to wait as standby"
    )
    workers = WorkerLauncher(settings, tmp_path / "runs.log", tmp_path)
    recording = Recording(tmp_path / "runs.log")
    try:
        workers.start()
        written = write_orders(Pipeline(settings), outbox_dsn, 3_000)
        assert wait_for(lambda: len(recording.run_counts()) >= 300, 90, interval=0.01)
        active.kill()
        wait_until(
            lambda: "active" in standby.log(),
            timeout=60,
            what="the standby to become active",
            watch=[standby],
        )
        wait_until(
            lambda: pending(outbox_dsn) == 0,
            timeout=RELAY_TIMEOUT_S,
            what="the standby to publish the rest",
            watch=[standby],
        )
        wait_until(
            lambda: recording.all_finished(written.committed),
            timeout=RELAY_TIMEOUT_S,
            what=lambda: f"{len(recording.finished_ids)} of {len(written.committed)} to finish",
            watch=workers.started,
        )
        assert check_ran(recording, written.committed, exactly_once=True) == []
    finally:
        workers.stop_all()


def test_a_keys_jobs_reach_kafka_in_the_order_they_were_committed(
    outbox_dsn: str, settings: Settings, relays: RelayLauncher
) -> None:
    apply_topics(settings)
    written = write_orders(
        Pipeline(settings), outbox_dsn, 2_000, rollback_every=4, key_of=lambda n: f"k{n % 7}"
    )
    relays.start(outbox_dsn, "--batch-size", "64")
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"{settings.namespace}.order-check",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    codec = Pipeline(settings).codec
    seen: dict[bytes, list[str]] = {}
    try:
        consumer.subscribe([f"{settings.namespace}.jobs.default"])
        want = len(written.committed)

        def read() -> bool:
            for message in consumer.consume(500, timeout=0.2):
                if message.error() is None:
                    key = message.key() or b""
                    seen.setdefault(key, []).append(codec.decode(message.value() or b"").id)
            return sum(map(len, seen.values())) >= want

        assert wait_for(read, RELAY_TIMEOUT_S, interval=0)
    finally:
        consumer.close()
    committed = set(written.committed)
    for key, ids in seen.items():
        of_key = set(ids)
        assert ids == [i for i in written.committed if i in of_key], f"key {key!r} out of order"
    assert set().union(*map(set, seen.values())) == committed


def test_a_relay_started_before_its_table_creates_it(
    sqlite_dsn: str, settings: Settings, relays: RelayLauncher
) -> None:
    connect(sqlite_dsn)[0].close()  # the service's database, without the table yet
    relay = relays.start(sqlite_dsn)
    wait_until(lambda: "active" in relay.log(), timeout=60, what="the relay to be active")
    assert pending(sqlite_dsn) == 0


class _StopsAfterKafka(OutboxRelay):
    """A relay that fails once right after Kafka committed a batch, before its delete: as a
    relay killed between the two commits, with its successor in the same process."""

    failed = False

    def _delete(self, connection: Any, dialect: Dialect, ids: list[int]) -> int:
        if self.active.is_set() and not self.failed:
            self.failed = True
            raise RuntimeError("stopped between Kafka's commit and the database's")
        return super()._delete(connection, dialect, ids)


def test_a_batch_kafka_committed_is_not_published_again_after_a_crash_before_its_delete(
    outbox_dsn: str, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    apply_topics(settings)
    written = write_orders(Pipeline(settings), outbox_dsn, 500, rollback_every=10**6)
    relay = _StopsAfterKafka(settings, outbox_dsn, RelayOptions(batch_size=100, retry_s=0.1))
    with caplog.at_level(logging.INFO, logger="pipeline.outbox"), relay_in_thread(relay):
        assert wait_for(lambda: pending(outbox_dsn) == 0, RELAY_TIMEOUT_S)
    assert relay.failed
    assert_published_once(settings, written.committed)
    assert "100 rows of the last batch Kafka committed" in caplog.text


def test_rows_for_a_missing_topic_wait_in_order_until_it_exists(
    sqlite_dsn: str, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    apply_topics(settings)
    elsewhere = Settings(
        bootstrap_servers=settings.bootstrap_servers, namespace=f"{settings.namespace}x"
    )
    missing = f"{elsewhere.namespace}.jobs.default"
    connection, _ = connect(sqlite_dsn)
    try:
        create_table(connection)
        here, there = Pipeline(settings).outbox(connection), Pipeline(elsewhere).outbox(connection)
        first = here.enqueue_many("noop", [{"n": 1}, {"n": 2}])  # ids 1, 2
        waiting = there.enqueue("noop", {"n": 3})  # id 3: its topic does not exist yet
        after = here.enqueue_many("noop", [{"n": 4}, {"n": 5}])  # ids 4, 5
        connection.commit()
    finally:
        connection.close()
    codec = Pipeline(settings).codec
    topic = f"{settings.namespace}.jobs.default"

    def ids(topic: str) -> list[str]:
        return [codec.decode(r.value() or b"").id for r in read_topic(settings, topic)]

    relay = OutboxRelay(settings, sqlite_dsn, RelayOptions(retry_s=0.1))
    with caplog.at_level(logging.INFO, logger="pipeline.outbox"), relay_in_thread(relay):
        # The rows before the missing topic's go out; it and those after it stay.
        assert wait_for(lambda: pending(sqlite_dsn) == 3, RELAY_TIMEOUT_S)
        assert sorted(ids(topic)) == sorted(first)
        assert f"outbox row 3 is a job for {missing}" in caplog.text
        apply_topics(elsewhere)
        assert wait_for(lambda: pending(sqlite_dsn) == 0, RELAY_TIMEOUT_S)
    assert sorted(ids(topic)) == sorted(first + after)
    assert ids(missing) == [waiting]
    assert "Kafka did not take" not in caplog.text  # no batch went out to fail in Kafka


def test_a_row_larger_than_the_relay_sends_waits_in_order_without_restarting_the_relay(
    sqlite_dsn: str, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # Written by a writer whose message.max.bytes is larger than the relay's: Kafka's producer
    # refuses the row. The relay used to give up being active on every try (a new producer, a
    # new registration each second) with every row of the table behind it.
    apply_topics(settings)
    connection, _ = connect(sqlite_dsn)
    try:
        create_table(connection)
        outbox = Pipeline(settings).outbox(connection)
        first = outbox.enqueue("noop", {"n": 1})  # id 1
        outbox.enqueue("noop", {"blob": "x" * 300_000})  # id 2
        outbox.enqueue("noop", {"n": 3})  # id 3
        connection.commit()
    finally:
        connection.close()
    small = settings.model_copy(update={"kafka": {"message.max.bytes": "100000"}})
    codec = Pipeline(settings).codec
    relay = OutboxRelay(small, sqlite_dsn, RelayOptions(retry_s=0.1))
    with caplog.at_level(logging.INFO, logger="pipeline.outbox"), relay_in_thread(relay):
        assert wait_for(lambda: pending(sqlite_dsn) == 2, RELAY_TIMEOUT_S)
        assert wait_for(lambda: "outbox row 2 takes" in caplog.text, RELAY_TIMEOUT_S)
    topic = f"{settings.namespace}.jobs.default"
    assert [codec.decode(r.value() or b"").id for r in read_topic(settings, topic)] == [first]
    assert caplog.text.count("active: publishing") == 1  # it stayed active, waiting
    assert "message.max.bytes" in caplog.text


def test_the_rows_before_a_row_kafka_refuses_at_the_commit_go_and_it_waits_named(
    sqlite_dsn: str, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    # The topic takes smaller messages than the relay's producer sends (a user who raised the
    # producer's message.max.bytes): the relay's gates pass the row, Kafka refuses it at the
    # commit. Its batch used to be sent again for ever, nothing of it published.
    topic = f"{settings.namespace}.jobs.default"
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    small = NewTopic(topic, 1, 1, config={"max.message.bytes": "2000"})
    admin.create_topics([small], operation_timeout=30)[topic].result()
    connection, _ = connect(sqlite_dsn)
    try:
        create_table(connection)
        outbox = Pipeline(settings).outbox(connection)
        first = outbox.enqueue_many("noop", [{"n": 1}, {"n": 2}])  # ids 1, 2
        # id 3: random, so that the producer's compression does not make it small enough
        outbox.enqueue("noop", {"blob": base64.b64encode(os.urandom(5000)).decode()})
        outbox.enqueue("noop", {"n": 4})  # id 4
        connection.commit()
    finally:
        connection.close()
    codec = Pipeline(settings).codec
    relay = OutboxRelay(settings, sqlite_dsn, RelayOptions(retry_s=0.1))
    with caplog.at_level(logging.INFO, logger="pipeline.outbox"), relay_in_thread(relay):
        assert wait_for(lambda: "outbox row 3 is a job for" in caplog.text, RELAY_TIMEOUT_S)
        assert pending(sqlite_dsn) == 2
    assert [codec.decode(r.value() or b"").id for r in read_topic(settings, topic)] == first
    assert "Message size too large" in caplog.text  # Kafka's reason, on the row's line
    assert caplog.text.count("active: publishing") == 1  # it stayed active, waiting
