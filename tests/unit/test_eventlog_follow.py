""":func:`pipeline._eventlog.follow_events` against a fake reader whose Kafka does not answer:
``until_idle`` does not end a tail as idle while Kafka is unreachable; ``timeout`` fails it."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline import _eventlog
from pipeline._errors import KafkaUnavailableError
from pipeline._eventlog import EventFilter, follow_events
from pipeline._settings import Settings


class _LostConsumer:
    """Delivers nothing; its metadata requests time out, as with every broker down."""

    def __init__(self) -> None:
        self.probes = 0

    def assign(self, partitions: list[Any]) -> None:
        pass

    def consume(self, count: int, timeout: float) -> list[Any]:
        return []

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.probes += 1
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))


class _LostReader:
    def __init__(self, settings: Settings, timeout: float) -> None:
        self.consumer = _LostConsumer()
        self.timeout = timeout

    def partitions(self, topic: str) -> list[int]:
        return [0]

    def unavailable(self, reason: object) -> KafkaUnavailableError:
        return KafkaUnavailableError(f"did not answer within {self.timeout:g}s ({reason})")

    def __enter__(self) -> _LostReader:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_a_tail_with_kafka_gone_fails_rather_than_ending_as_idle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_eventlog, "TopicReader", _LostReader)
    events = follow_events(Settings(), EventFilter(), until_idle=0.1, timeout=0.3)
    with pytest.raises(KafkaUnavailableError, match=r"within 0\.3s"):
        list(events)
