"""The producer's defaults, and KafkaTransport.produce_many against a stand-in librdkafka."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import pipeline._producer as producer_module
from pipeline import PipelineError, Settings
from pipeline._producer import KafkaTransport, producer_config


def test_the_default_producer_sends_at_once() -> None:
    # No linger: a single enqueue is on its way at once; enqueue_many fills batches anyway,
    # since it queues many jobs while librdkafka's requests are in flight.
    assert Settings().producer.linger_ms == 0
    assert producer_config(Settings())["linger.ms"] == 0


def test_the_linger_is_still_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_PRODUCER__LINGER_MS", "5")
    assert producer_config(Settings())["linger.ms"] == 5


class _FakeProducer:
    """librdkafka's Producer as far as KafkaTransport uses it; full once, after ``room``."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.sent: list[tuple[str, bytes, bytes | None]] = []
        self.polls = 0
        self.room: int | None = None
        self.refuse: KafkaError | None = None

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
    return KafkaTransport(Settings(bootstrap_servers="localhost:1"))


def _fake(transport: KafkaTransport) -> _FakeProducer:
    fake = transport._get()
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


def test_produce_many_refuses_after_a_fatal_error(transport: KafkaTransport) -> None:
    _fake(transport)
    transport._on_error(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    with pytest.raises(PipelineError, match="failed for good"):
        transport.produce_many("t", [b"x"], None, _ignore)
