"""Enqueueing against a real Kafka: the bytes, the topic, the partition, and a dead broker."""

from __future__ import annotations

import json
import socket
import uuid
from collections import Counter

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Message

from pipeline import (
    EnqueueError,
    KafkaUnavailableError,
    PayloadValidationError,
    Pipeline,
    Priority,
    Settings,
)
from pipeline._admin import apply_topics
from pipeline_cli import cli


@pytest.fixture
def app(settings: Settings) -> Pipeline:
    apply_topics(settings)
    return Pipeline(settings)


def read_all(bootstrap_servers: str, topic: str, count: int, timeout: float = 30) -> list[Message]:
    """Every message of ``topic`` from the beginning, with a plain consumer: ``count`` of them."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        messages: list[Message] = []
        batch_deadline = timeout
        while len(messages) < count and batch_deadline > 0:
            for message in consumer.consume(num_messages=count - len(messages), timeout=1):
                assert message.error() is None, message.error()
                messages.append(message)
            batch_deadline -= 1
        return messages
    finally:
        consumer.close()


def murmur2(key: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (what the Java client's partitioner hashes keys with), signed."""
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    length = len(key)
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = key[length - length % 4 :]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def kafka_partition(key: bytes, partitions: int) -> int:
    """The partition the Java client picks for ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def test_job_lands_on_its_priority_topic_with_the_right_bytes(
    app: Pipeline, bootstrap_servers: str
) -> None:
    handle = app.submit(
        "email.send",
        {"to": "a@b.c"},
        priority="high",
        key="customer-7",
        tenant="acme",
        headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    ).wait()
    [message] = read_all(bootstrap_servers, app.topics.jobs("high"), 1)
    value = message.value()
    assert value is not None
    assert value[:2] == b"\xc3\x01", "Avro single-object encoding marker"
    job = app.codec.decode(value)
    assert job.id == handle.job_id
    assert (job.type, job.priority, job.tenant) == ("email.send", Priority.HIGH, "acme")
    assert json.loads(job.payload) == {"to": "a@b.c"}
    assert job.headers["traceparent"].startswith("00-0af7")
    assert message.key() == b"customer-7"
    assert (message.partition(), message.offset()) == (handle.partition, handle.offset)


def test_a_key_maps_to_the_java_clients_partition(app: Pipeline, bootstrap_servers: str) -> None:
    partitions = app.settings.topics.partitions
    keys = [f"order-{i}" for i in range(30)]
    handles = [app.submit("t", {}, key=key) for key in keys]
    for key, handle in zip(keys, handles, strict=True):
        handle.wait()
        assert handle.partition == kafka_partition(key.encode(), partitions), key
    # and the idempotency key wins over the key
    handle = app.submit("t", {}, key="order-1", idempotency_key="pay-1").wait()
    assert handle.partition == kafka_partition(b"pay-1", partitions)


def test_enqueue_many_then_flush_delivers_all_in_order(
    app: Pipeline, bootstrap_servers: str
) -> None:
    ids = app.enqueue_many("bulk", ({"i": i} for i in range(500)), key="one-partition")
    app.flush(timeout=30)
    messages = read_all(bootstrap_servers, app.topics.jobs("default"), 500)
    assert [app.codec.decode(m.value() or b"").id for m in messages] == ids


def test_a_job_too_large_to_send_is_refused_before_kafka_and_the_batch_before_it_is_sent(
    app: Pipeline, bootstrap_servers: str
) -> None:
    big = {"blob": "x" * 1_100_000}  # above librdkafka's default message.max.bytes
    with pytest.raises(PayloadValidationError, match=r"'bulk'.*message\.max\.bytes"):
        app.enqueue("bulk", big)
    with pytest.raises(PayloadValidationError, match="job #2 of the batch"):
        app.enqueue_many("bulk", [{"i": 0}, {"i": 1}, big, {"i": 3}], key="one-partition")
    app.flush(timeout=30)
    messages = read_all(bootstrap_servers, app.topics.jobs("default"), 2)
    assert [json.loads(app.codec.decode(m.value() or b"").payload) for m in messages] == [
        {"i": 0},
        {"i": 1},
    ]


def test_a_keys_jobs_keep_their_order_across_single_and_bulk_enqueues(
    app: Pipeline, bootstrap_servers: str
) -> None:
    # Single enqueues and enqueue_many go through two producers (two lingers); a key's jobs
    # must still reach its partition in the order they were enqueued.
    ids: list[str] = []
    for round_ in range(3):
        ids += app.enqueue_many("t", ({"r": round_, "i": i} for i in range(300)), key="k")
        ids += [app.enqueue("t", {"r": round_, "single": i}, key="k") for i in range(5)]
    app.flush(timeout=30)
    messages = read_all(bootstrap_servers, app.topics.jobs("default"), len(ids))
    assert [app.codec.decode(m.value() or b"").id for m in messages] == ids
    assert len({m.partition() for m in messages}) == 1


def test_a_burst_of_unkeyed_jobs_spreads_over_every_partition(
    app: Pipeline, bootstrap_servers: str
) -> None:
    # A fresh producer, a burst faster than a metadata round-trip: librdkafka's sticky
    # partitioner would put it all on one partition, and one worker would run it alone.
    count = 2400
    app.enqueue_many("bulk", ({"i": i} for i in range(count)))
    app.flush(timeout=30)
    messages = read_all(bootstrap_servers, app.topics.jobs("default"), count)
    assert len(messages) == count
    partitions = app.settings.topics.partitions
    spread = Counter(m.partition() or 0 for m in messages)
    mean = count / partitions
    # Uniform at random, each partition gets the mean give or take a few standard deviations
    # (about 18 jobs with 6 partitions); half the mean is far outside that.
    assert sorted(spread) == list(range(partitions)), sorted(spread.items())
    assert min(spread.values()) >= mean / 2, sorted(spread.items())


def test_delayed_job_goes_to_the_deferred_topic(app: Pipeline, bootstrap_servers: str) -> None:
    job_id = app.enqueue("later", {"x": 1}, delay=3600, wait=True)
    [message] = read_all(bootstrap_servers, app.topics.deferred, 1)
    job = app.codec.decode(message.value() or b"")
    assert job.id == job_id
    assert job.not_before is not None
    assert job.not_before > job.created_at + 3_500_000


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_broker_down_is_a_clear_error() -> None:
    servers = f"127.0.0.1:{closed_port()}"
    app = Pipeline(Settings(bootstrap_servers=servers, producer={"delivery_timeout_s": 2}))
    with pytest.raises(KafkaUnavailableError, match=servers):
        app.enqueue("t", {"a": 1}, wait=True)
    app.enqueue("t", {"a": 2})
    with pytest.raises(KafkaUnavailableError, match="running"):
        app.flush(timeout=10)


def test_cli_enqueue_prints_the_id(settings: Settings, bootstrap_servers: str) -> None:
    apply_topics(settings)
    runner = CliRunner()
    args = ["--bootstrap-servers", bootstrap_servers, "--namespace", settings.namespace]
    result = runner.invoke(
        cli,
        ["enqueue", "report.build", "--payload", '{"id": 7}', "--priority", "low", "--json", *args],
    )
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    [message] = read_all(bootstrap_servers, f"{settings.namespace}.jobs.low", 1)
    assert message.partition() == printed["partition"]
    job = Pipeline(settings).codec.decode(message.value() or b"")
    assert job.id == printed["id"]
    assert json.loads(job.payload) == {"id": 7}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["enqueue", "t", "--payload", "{not json"], "not valid JSON"),
        (["enqueue", "t", "--payload", "[1]"], "JSON object"),
        (["enqueue", "t", "--priority", "urgent"], "urgent"),
        (["enqueue", "t", "--header", "novalue"], "NAME=VALUE"),
    ],
)
def test_cli_enqueue_rejects_bad_arguments(argv: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 2
    assert message in result.output


def test_cli_enqueue_broker_down_exits_1() -> None:
    servers = f"127.0.0.1:{closed_port()}"
    result = CliRunner().invoke(
        cli, ["enqueue", "t", "--bootstrap-servers", servers, "--timeout", "2"]
    )
    assert result.exit_code == 1
    assert servers in result.output


def test_murmur2_matches_kafka_reference_values() -> None:
    # The vectors of Kafka's UtilsTest.testMurmur2.
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"a-little-bit-longer-string") == -1486304829
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971
    assert murmur2(b"abc") == 479470107


def test_a_missing_topic_is_named_not_taken_for_an_outage(bootstrap_servers: str) -> None:
    # librdkafka holds jobs for a topic it cannot find for topic.metadata.propagation.max.ms
    # (30 s by default), which is as long as the delivery timeout: they timed out first.
    settings = Settings(
        bootstrap_servers=bootstrap_servers,
        namespace=f"missing{uuid.uuid4().hex[:8]}",
        producer={"delivery_timeout_s": 4},
    )
    app = Pipeline(settings)
    app.enqueue("t", {"a": 1})
    with pytest.raises(EnqueueError, match=r"jobs\.default does not exist.*topics apply"):
        app.flush()
    # librdkafka knows now: it refuses the next job at once, which is said the same way.
    with pytest.raises(EnqueueError, match=r"jobs\.default does not exist.*topics apply"):
        app.enqueue("t", {"a": 2})
