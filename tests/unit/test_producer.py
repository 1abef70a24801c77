"""The producer's defaults, and KafkaTransport.produce_many against a stand-in librdkafka."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import pipeline._producer as producer_module
import pipeline._transport as transport_module
from pipeline import EnqueueError, KafkaAuthenticationError, Pipeline, PipelineError, Settings
from pipeline._producer import KafkaTransport, producer_config


def test_single_jobs_go_out_at_once_and_batches_linger_by_default() -> None:
    assert Settings().producer.linger_ms == 0
    assert producer_config(Settings())["linger.ms"] == 0
    assert producer_config(Settings(), bulk=True)["linger.ms"] == 5


def test_requests_are_not_held_back_by_nagle_whatever_the_librdkafka_release() -> None:
    # The durability settings stay as they are: low latency costs none of it.
    for bulk in (False, True):
        conf = producer_config(Settings(), bulk=bulk)
        assert conf["socket.nagle.disable"] is True
        assert (conf["acks"], conf["enable.idempotence"]) == ("all", True)
    override = Settings(kafka={"socket.nagle.disable": "false"})
    assert producer_config(override)["socket.nagle.disable"] == "false"


def test_the_linger_is_still_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_PRODUCER__LINGER_MS", "5")
    assert producer_config(Settings())["linger.ms"] == 5


made: list[_FakeProducer] = []


class _FakeProducer:
    """librdkafka's Producer as far as KafkaTransport uses it; full once, after ``room``."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.delivered = 0
        self.sent: list[tuple[str, bytes, bytes | None]] = []
        self.polls = 0
        self.room: int | None = None
        self.refuse: KafkaError | None = None
        self.flushes = 0
        made.append(self)

    def __len__(self) -> int:
        return len(self.sent) - self.delivered

    def flush(self, timeout: float) -> int:
        self.flushes += 1
        self.delivered = len(self.sent)
        return 0

    def produce(self, topic: str, value: bytes, key: bytes | None, *, on_delivery: Any) -> None:
        if self.refuse is not None:
            raise KafkaException(self.refuse)
        if self.room is not None and len(self.sent) >= self.room and self.polls == 0:
            raise BufferError("Local: Queue full")
        self.sent.append((topic, value, key))

    def poll(self, timeout: float = 0) -> int:
        self.polls += 1
        return 0


@pytest.fixture
def transport(monkeypatch: pytest.MonkeyPatch) -> KafkaTransport:
    monkeypatch.setattr(producer_module, "Producer", _FakeProducer)
    monkeypatch.setattr(transport_module, "POLL_EVERY_S", 3600.0)  # the test polls, alone
    made.clear()
    return KafkaTransport(Settings(bootstrap_servers="localhost:1"))


def _fake(transport: KafkaTransport) -> _FakeProducer:
    fake = transport._get(bulk=True)
    assert isinstance(fake, _FakeProducer)
    return fake


def _ignore(_error: object, _message: object) -> None:
    return None


def test_produce_many_sends_every_value_in_order_with_the_key(transport: KafkaTransport) -> None:
    values = [b"a", b"b", b"c"]
    transport.produce_many("t", values, b"k", _ignore)
    assert _fake(transport).sent == [("t", b"a", b"k"), ("t", b"b", b"k"), ("t", b"c", b"k")]


def test_produce_many_waits_for_room_when_the_local_queue_is_full(
    transport: KafkaTransport,
) -> None:
    fake = _fake(transport)
    fake.room = 2
    transport.produce_many("t", [b"1", b"2", b"3", b"4"], None, _ignore)
    assert [value for _topic, value, _key in fake.sent] == [b"1", b"2", b"3", b"4"]
    assert fake.polls >= 1  # served librdkafka until the queue had room


def test_produce_many_turns_a_refusal_into_a_pipeline_error(transport: KafkaTransport) -> None:
    _fake(transport).refuse = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    with pytest.raises(PipelineError, match="cannot produce to t"):
        transport.produce_many("t", [b"x"], None, _ignore)


@pytest.mark.parametrize(
    ("code", "said"),
    [
        (KafkaError._UNKNOWN_TOPIC, r"topic acme\.jobs\.default does not exist; create the topics"),
        (KafkaError.UNKNOWN_TOPIC_OR_PART, r"acme\.jobs\.default does not exist.*topics apply"),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, r"lacks WRITE on TOPIC acme\.jobs\.default"),
    ],
)
def test_a_topic_the_producer_refuses_at_once_is_told_as_its_delivery_report_tells_it(
    transport: KafkaTransport, code: int, said: str
) -> None:
    """Once librdkafka learned that a topic is missing, ``produce`` refuses its jobs itself:
    the error is the one a failed delivery report gives at flush, naming the job."""
    app = Pipeline(Settings(namespace="acme", bootstrap_servers="localhost:1"), transport=transport)
    app.enqueue("t", {"n": 0})
    _fake(transport)  # both producers made
    for producer in made:
        producer.refuse = KafkaError(code, "Unable to produce message: Local: Unknown topic")
    for enqueue in (lambda: app.enqueue("t", {"n": 1}), lambda: app.enqueue_many("t", [{}])):
        with pytest.raises(EnqueueError, match=said) as caught:
            enqueue()
        assert caught.value.job_id.startswith("01")  # the job's own id


def test_a_producer_that_failed_for_good_is_replaced_by_a_new_one(
    transport: KafkaTransport,
) -> None:
    # It was kept, and refused every later job until the process restarted.
    transport.produce_many("t", [b"1"], None, _ignore)
    failed = _fake(transport)
    failed.refuse = KafkaError(KafkaError._FATAL, "Local: Fatal error")
    transport.produce_many("t", [b"2", b"3"], None, _ignore)
    fresh = _fake(transport)
    assert fresh is not failed
    assert [v for _t, v, _k in fresh.sent] == [b"2", b"3"]
    retired: dict[Any, KafkaError] = transport._retired
    assert retired == {failed: failed.refuse}


def test_batches_have_a_lingering_producer_of_their_own(transport: KafkaTransport) -> None:
    transport.produce("t", b"single", None, _ignore)
    transport.produce_many("t", [b"bulk"], None, _ignore)
    single, bulk = made
    assert (single.conf["linger.ms"], bulk.conf["linger.ms"]) == (0, 5)
    assert [v for _t, v, _k in single.sent] == [b"single"]
    assert [v for _t, v, _k in bulk.sent] == [b"bulk"]
    assert transport.flush(1) == 0
    assert (single.flushes, bulk.flushes) == (1, 1)


def test_a_keyed_job_waits_for_the_other_producers_jobs_so_a_key_keeps_its_order(
    transport: KafkaTransport,
) -> None:
    transport.produce_many("t", [b"1", b"2"], b"k", _ignore)
    transport.produce("t", b"3", b"k", _ignore)  # after the batch has left
    bulk, single = made
    assert bulk.flushes == 1
    transport.produce_many("t", [b"4"], b"k", _ignore)  # after the single job has left
    assert single.flushes == 1


def test_a_keyed_job_stops_waiting_for_the_other_producer_when_kafka_refuses_the_credentials(
    transport: KafkaTransport,
) -> None:
    """The other producer never empties (Kafka down); Kafka then refuses the credentials: the
    keyed job stops waiting at once and raises why, as a flush does, instead of waiting for
    the delivery timeout in one blocking flush."""
    transport.produce_many("t", [b"1"], b"k", _ignore)
    [bulk] = made

    def stuck(timeout: float) -> int:
        bulk.flushes += 1
        transport._refusal.report("SASL authentication error: Authentication failed")
        return len(bulk)

    bulk.flush = stuck  # type: ignore[method-assign]
    with pytest.raises(KafkaAuthenticationError):
        transport.produce("t", b"2", b"k", _ignore)
    assert bulk.flushes == 1
    assert [p.sent for p in made[1:]] == [[]]  # the keyed job was not sent before the batch


def test_unkeyed_jobs_do_not_wait_for_the_other_producer(transport: KafkaTransport) -> None:
    transport.produce_many("t", [b"1", b"2"], None, _ignore)
    transport.produce("t", b"3", None, _ignore)
    assert [p.flushes for p in made] == [0, 0]


def test_equal_lingers_make_one_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(producer_module, "Producer", _FakeProducer)
    monkeypatch.setenv("PIPELINE_PRODUCER__BULK_LINGER_MS", "0")
    made.clear()
    transport = KafkaTransport(Settings(bootstrap_servers="localhost:1"))
    transport.produce("t", b"1", b"k", _ignore)
    transport.produce_many("t", [b"2"], b"k", _ignore)
    [only] = made
    assert [v for _t, v, _k in only.sent] == [b"1", b"2"]
    assert only.flushes == 0


def test_a_job_for_a_topic_kafka_does_not_know_fails_rather_than_creating_it() -> None:
    """Against librdkafka's mock cluster, which creates a topic a client asks it to, as brokers
    do by default: the job fails, naming the topic, instead of landing in a new topic of one
    partition that no worker reads."""
    settings = Settings(
        namespace="mistyped",
        kafka={"test.mock.num.brokers": "1", "topic.metadata.propagation.max.ms": "500"},
        producer={"delivery_timeout_s": 5.0},
    )
    app = Pipeline(settings)
    try:
        app.enqueue("report", {}, priority="high")
        with pytest.raises(EnqueueError, match=r"mistyped\.jobs\.high"):
            app.flush(10)
        # librdkafka knows now: produce() refuses the next job itself, said the same way.
        with pytest.raises(EnqueueError, match=r"mistyped\.jobs\.high does not exist.*apply"):
            app.enqueue("report", {}, priority="high")
    finally:
        app.close()
