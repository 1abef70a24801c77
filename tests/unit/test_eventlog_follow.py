""":func:`pipeline._eventlog.follow_events` against a fake reader whose Kafka does not answer:
``until_idle`` does not end a tail as idle while Kafka is unreachable; ``timeout`` fails it."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline import _eventlog
from pipeline._codec import EventCodec
from pipeline._errors import KafkaUnavailableError
from pipeline._eventlog import EventFilter, follow_events
from pipeline._records import Event
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


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class _Eof:
    def __init__(self, partition: int) -> None:
        self._partition = partition

    def error(self) -> KafkaError:
        return KafkaError(KafkaError._PARTITION_EOF)

    def partition(self) -> int:
        return self._partition


class _Record:
    def __init__(self, value: bytes) -> None:
        self._value = value

    def error(self) -> None:
        return None

    def value(self) -> bytes:
        return self._value

    def key(self) -> bytes:
        return b"j1"

    def topic(self) -> str:
        return "pipeline.events"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 0


def _event(n: int) -> bytes:
    return EventCodec().encode(
        Event(job_id="j1", job_type="t", kind="dead", attempt=n, priority="default", at=n)
    )


class _ScriptedConsumer:
    """On a fake clock: each ``consume()`` takes its timeout and returns what ``arrivals`` has
    due by then; metadata requests fail (taking their timeout) inside ``down``."""

    def __init__(
        self, clock: _Clock, arrivals: list[tuple[float, Any]], down: tuple[float, float]
    ) -> None:
        self.clock = clock
        self.arrivals = arrivals
        self.down = down

    def assign(self, partitions: list[Any]) -> None:
        pass

    def consume(self, count: int, timeout: float) -> list[Any]:
        self.clock.now += timeout
        due = [m for at, m in self.arrivals if at <= self.clock.now]
        self.arrivals = [(at, m) for at, m in self.arrivals if at > self.clock.now]
        return due

    def list_topics(self, topic: str, timeout: float) -> Any:
        if self.down[0] <= self.clock.now < self.down[1]:
            self.clock.now += timeout
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return object()


def _follow(
    monkeypatch: pytest.MonkeyPatch,
    arrivals: list[tuple[float, Any]],
    down: tuple[float, float] = (0.0, 0.0),
    partitions: int = 1,
    **options: Any,
) -> tuple[list[int], float]:
    clock = _Clock()
    consumer = _ScriptedConsumer(clock, arrivals, down)

    class Reader(_LostReader):
        def __init__(self, settings: Settings, timeout: float) -> None:
            super().__init__(settings, timeout)
            self.consumer = consumer  # type: ignore[assignment]

        def partitions(self, topic: str) -> list[int]:
            return list(range(partitions))

    monkeypatch.setattr(_eventlog, "TopicReader", Reader)
    monkeypatch.setattr(_eventlog, "time", clock)
    events = follow_events(Settings(), EventFilter(), timeout=30.0, **options)
    return [event.attempt for event in events], clock.now


def test_an_idle_tail_outlives_an_outage_and_reads_what_came_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Kafka down from 0.5 s to 3 s; the workers' held events reach it 0.6 s after.
    attempts, ended = _follow(
        monkeypatch, [(3.6, _Record(_event(1)))], down=(0.5, 3.0), until_idle=2.0
    )
    assert attempts == [1], "the tail ended at the first answer after the outage"
    assert ended >= 3.6 + 2.0


def test_a_tail_from_the_beginning_is_not_idle_before_it_read_every_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first fetch takes 0.8 s (a TLS handshake with the leaders); partition 1 ends later.
    arrivals: list[tuple[float, Any]] = [
        (0.8, _Record(_event(1))),
        (0.8, _Eof(0)),
        (2.5, _Record(_event(2))),
        (2.5, _Eof(1)),
    ]
    attempts, ended = _follow(
        monkeypatch, arrivals, partitions=2, from_beginning=True, until_idle=0.5
    )
    assert attempts == [1, 2]
    assert ended >= 2.5 + 0.5


def test_a_tail_from_the_beginning_fails_on_a_partition_never_read_to_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(KafkaUnavailableError, match=r"partition\(s\) \[1\] not read"):
        _follow(monkeypatch, [(0.4, _Eof(0))], partitions=2, from_beginning=True, until_idle=1)


def test_a_tail_says_it_left_out_records_it_cannot_decode(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    arrivals: list[tuple[float, Any]] = [(0.2, _Record(b"\x00newer")), (0.4, _Record(_event(3)))]
    with caplog.at_level(logging.WARNING, logger="pipeline.events"):
        attempts, _ = _follow(monkeypatch, arrivals, until_idle=1.0)
    assert attempts == [3]
    assert "could not be decoded as events" in caplog.text
