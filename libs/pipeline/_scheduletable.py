"""The ``<ns>.schedules`` table on Kafka: publishing schedules, tombstones, reading them back.

Records are written as :class:`~pipeline._records.Schedule` values keyed by name, a tombstone
removes one; what they mean, and how a reader judges one, is :mod:`pipeline._schedule`'s.

The topic has one partition when ``pipeline topics apply`` creates it. One created otherwise
(on first write, by a cluster whose ``num.partitions`` is larger) may have several, and a
schedule's records may be in more than one (:class:`pipeline._tablereader.Newest` says which
wins). On such a topic every record is written to partition 0, then a tombstone of its key to
every other partition: a record of an earlier release left there, newer than a removal in
partition 0, would win again once compaction took the removal's tombstone.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ._clientlog import LastProblemLog
from ._codec import ScheduleCodec
from ._errors import KafkaUnavailableError, PipelineError
from ._job import now_ms
from ._newclient import client
from ._schedule import ScheduleRecord, decode_schedule, same_definition
from ._tablereader import read_table
from ._topics import TopicNames

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._records import Schedule
    from ._settings import Settings

__all__ = [
    "delete_schedule",
    "publish_schedules",
    "read_schedule_records",
    "read_schedules",
    "save_schedules",
]


def _producer(settings: Settings) -> Any:
    from confluent_kafka import Producer

    from ._producer import producer_config

    conf = producer_config(settings)
    conf["linger.ms"] = 0
    # librdkafka's own lines only explain a failure the error raised says already: kept at
    # DEBUG, as the backlog reader keeps them (a command run while Kafka is down printed
    # hundreds of them before its one-line error).
    conf["logger"] = LastProblemLog()
    return client(Producer, conf)


def _write(settings: Settings, records: list[tuple[str, bytes | None]], timeout: float) -> None:
    producer = _producer(settings)
    topic = TopicNames(settings.namespace).schedules
    partitions = _partitions(producer, topic, timeout)
    if partitions == 1:
        _send(settings, producer, [(key, value, None) for key, value in records], timeout)
        return
    # See the module docstring. The records first: a tombstone written without its record
    # would remove the schedule where it is the newest, and a failed write must change nothing.
    _send(settings, producer, [(key, value, 0) for key, value in records], timeout)
    shadows = [(key, None, other) for key, _ in records for other in range(1, partitions)]
    _send(settings, producer, shadows, timeout)


def _send(
    settings: Settings,
    producer: Any,
    records: Sequence[tuple[str, bytes | None, int | None]],
    timeout: float,
) -> None:
    """Write ``records`` (key, value, partition or None: the key's) and wait until Kafka has
    them all; raises saying what failed."""
    from confluent_kafka import KafkaException

    topic = TopicNames(settings.namespace).schedules
    errors: list[str] = []

    def on_delivery(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(error.str())

    for key, value, partition in records:
        where = {} if partition is None else {"partition": partition}
        try:
            producer.produce(topic, value, key.encode(), on_delivery=on_delivery, **where)
        except KafkaException as exc:  # refused before sending: too large, say
            reason = exc.args[0].str() if exc.args else str(exc)
            raise PipelineError(f"schedule {key!r} could not be written: {reason}") from exc
    if producer.flush(timeout):
        raise KafkaUnavailableError(
            f"Kafka at {settings.bootstrap_servers} did not acknowledge the schedule write "
            f"within {timeout:g}s; is it running?"
        )
    if errors:
        raise KafkaUnavailableError(
            f"writing to {topic} failed: {errors[0]} (does the topic exist? "
            "`pipeline topics apply` creates it)"
        )


def _partitions(producer: Any, topic: str, timeout: float) -> int:
    """How many partitions ``topic`` has (1 if the cluster does not say: written as before)."""
    from confluent_kafka import KafkaException

    try:
        found = producer.list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException:
        return 1
    return len(found.partitions) if found is not None and found.error is None else 1


def publish_schedules(
    settings: Settings, schedules: list[Schedule], timeout: float = 30.0
) -> list[str]:
    """Write ``schedules`` to ``<ns>.schedules``, skipping the unchanged; return names written.

    A schedule paused on the topic stays paused (its definition is updated): pausing is the
    operators' call, which only :func:`~pipeline._scheduleops.resume_schedule` undoes.
    """
    return save_schedules(settings, schedules, timeout)[0]


def save_schedules(
    settings: Settings, schedules: list[Schedule], timeout: float = 30.0
) -> tuple[list[str], list[str]]:
    """:func:`publish_schedules`, which also returns the names of ``schedules`` that stay
    paused: (names written, names paused)."""
    current = read_schedules(settings, timeout=timeout) if schedules else {}
    codec = ScheduleCodec()
    stamp = now_ms()
    kept = [
        replace(s, enabled=False) if s.name in current and not current[s.name].enabled else s
        for s in schedules
    ]
    changed = [s for s in kept if s.name not in current or not same_definition(s, current[s.name])]
    _write(
        settings, [(s.name, codec.encode(replace(s, created_at=stamp))) for s in changed], timeout
    )
    return [s.name for s in changed], [s.name for s in kept if not s.enabled]


def delete_schedule(settings: Settings, name: str, timeout: float = 30.0) -> bool:
    """Tombstone schedule ``name``, valid or not; False when no such schedule exists."""
    if name not in read_schedule_records(settings, timeout=timeout):
        return False
    _write(settings, [(name, None)], timeout)
    return True


def read_schedule_records(settings: Settings, timeout: float = 30.0) -> dict[str, ScheduleRecord]:
    """Every record on ``<ns>.schedules`` by name, the latest of each, valid or not."""
    codec = ScheduleCodec()
    table: dict[str, ScheduleRecord] = {}
    for key, value in read_table(settings, TopicNames(settings.namespace).schedules, timeout):
        if value is None:
            table.pop(key, None)
        else:
            table[key] = decode_schedule(key, value, codec)
    return table


def read_schedules(settings: Settings, timeout: float = 30.0) -> dict[str, Schedule]:
    """The valid schedules on ``<ns>.schedules``, by name."""
    return {
        name: record.schedule
        for name, record in read_schedule_records(settings, timeout).items()
        if record.problem is None and record.schedule is not None
    }
