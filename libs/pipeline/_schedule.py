"""Cron schedules in code: validation, fire times, fire ids, and the ``<ns>.schedules`` table.

A schedule is a :class:`pipeline._records.Schedule` record (the wire contract) keyed by its name
on the compacted ``<ns>.schedules`` topic; a tombstone removes it. ``pipeline-scheduler`` fires
them. Everything here except :func:`publish_schedules`, :func:`delete_schedule` and
:func:`read_schedules` is pure: fire times are computed by croniter in the schedule's time zone
(zoneinfo), so daylight-saving transitions follow croniter's rules, and a fire's job id and
idempotency key are derived from (namespace, name, fire time) so a fire enqueues exactly once.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from ._codec import JsonPayload, PayloadCodec, ScheduleCodec
from ._errors import ConfigurationError, DecodeError, KafkaUnavailableError
from ._job import Job, Priority, now_ms
from ._records import MissedFires, Schedule
from ._topics import TopicNames

if TYPE_CHECKING:
    from ._settings import Settings

__all__ = [
    "FIRE_ID_NAMESPACE",
    "delete_schedule",
    "due_fires",
    "fire_idempotency_key",
    "fire_job",
    "fire_job_id",
    "fires_between",
    "make_schedule",
    "next_fire_ms",
    "payload_text",
    "publish_schedules",
    "read_schedules",
    "read_table",
    "same_definition",
    "validate_schedule",
]

FIRE_ID_NAMESPACE = uuid.UUID("5b0f1c2e-6a1d-5d3e-9c53-7f1e0c1a9b21")
"""The uuid5 namespace of fire job ids (fixed forever: changing it would re-fire)."""

_JSON = JsonPayload()


def _zone(tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"unknown time zone {tz!r}; use an IANA name such as 'Europe/Paris' or 'UTC'"
        ) from None


def validate_schedule(cron: str, tz: str = "UTC", missed: str = MissedFires.SKIP) -> None:
    """Raise :class:`ConfigurationError` unless ``cron``, ``tz`` and ``missed`` are usable."""
    _zone(tz)
    if not croniter.is_valid(cron):
        raise ConfigurationError(
            f"invalid cron expression {cron!r}: give five fields (minute hour day month weekday)"
            " or six with seconds last, e.g. '*/5 * * * *' or '* * * * * */10'"
        )
    if missed not in {m.value for m in MissedFires}:
        raise ConfigurationError(f"missed must be one of skip, once, all; got {missed!r}")


def next_fire_ms(cron: str, tz: str, after_ms: int) -> int:
    """The first fire strictly after ``after_ms`` (epoch ms), evaluated in time zone ``tz``."""
    start = datetime.fromtimestamp(after_ms / 1000, tz=UTC).astimezone(_zone(tz))
    fire: datetime = croniter(cron, start).get_next(datetime)
    return round(fire.timestamp() * 1000)


def fires_between(cron: str, tz: str, after_ms: int, until_ms: int, limit: int) -> list[int]:
    """Fire times in ``(after_ms, until_ms]``, oldest first, at most ``limit`` (the newest)."""
    start = datetime.fromtimestamp(after_ms / 1000, tz=UTC).astimezone(_zone(tz))
    it = croniter(cron, start)
    fires: list[int] = []
    while True:
        fire = round(it.get_next(datetime).timestamp() * 1000)
        if fire > until_ms:
            return fires
        fires.append(fire)
        if len(fires) > limit:
            del fires[0]


def due_fires(
    cron: str,
    tz: str,
    last_fire_ms: int,
    now: int,
    missed: str,
    *,
    grace_ms: int = 0,
    limit: int = 10_000,
) -> list[int]:
    """The fire times to enqueue now, given the last fire done: the missed-fire policy.

    Fires in ``(last_fire_ms, now]`` are due. Those at most ``grace_ms`` old are late, not
    missed: they always fire (a failover takes seconds). Older ones are missed and follow the
    policy: ``skip`` drops them, ``once`` fires the newest missed one alone, ``all`` fires each
    (at most ``limit``, the newest).
    """
    due = fires_between(cron, tz, last_fire_ms, now, limit)
    late = [f for f in due if f >= now - grace_ms]
    lost = due[: len(due) - len(late)]
    if not lost or missed == MissedFires.SKIP:
        return late
    if missed == MissedFires.ONCE:
        return [lost[-1], *late]
    return due


def fire_job_id(namespace: str, name: str, fire_ms: int) -> str:
    """The job id of one fire: 32 hex digits, the same in every scheduler process."""
    return uuid.uuid5(FIRE_ID_NAMESPACE, f"{namespace}\x00{name}\x00{fire_ms}").hex


def fire_idempotency_key(name: str, fire_ms: int) -> str:
    return f"cron:{name}:{fire_ms}"


def fire_job(schedule: Schedule, namespace: str, fire_ms: int, default_max_attempts: int) -> Job:
    """The job one fire of ``schedule`` enqueues (its id and key derive from the fire time)."""
    headers = dict(schedule.headers)
    headers.setdefault("pipeline-schedule", schedule.name)
    return Job(
        id=fire_job_id(namespace, schedule.name, fire_ms),
        type=schedule.job_type,
        payload=schedule.payload,
        payload_encoding=schedule.payload_encoding,
        priority=schedule.priority,
        max_attempts=schedule.max_attempts or default_max_attempts,
        not_before=fire_ms,
        idempotency_key=fire_idempotency_key(schedule.name, fire_ms),
        headers=headers,
    )


def make_schedule(
    name: str,
    *,
    cron: str,
    job_type: str,
    payload: Mapping[str, Any] | bytes | None = None,
    tz: str = "UTC",
    missed: str = MissedFires.SKIP,
    priority: Priority | str = Priority.DEFAULT,
    max_attempts: int | None = None,
    headers: Mapping[str, str] | None = None,
    payload_codec: PayloadCodec | None = None,
    enabled: bool = True,
) -> Schedule:
    """A validated :class:`Schedule`; a mapping payload is encoded (JSON, or ``payload_codec``)."""
    if not name or "\x00" in name:
        raise ConfigurationError(f"invalid schedule name {name!r}")
    validate_schedule(cron, tz, missed)
    if max_attempts is not None and max_attempts < 1:
        raise ConfigurationError(f"max_attempts must be at least 1, got {max_attempts}")
    codec = payload_codec or _JSON
    if isinstance(payload, bytes):
        data, encoding = payload, codec.encoding
    else:
        data, encoding = codec.encode(job_type, payload or {}), codec.encoding
    return Schedule(
        name=name,
        cron=cron,
        job_type=job_type,
        payload=data,
        payload_encoding=encoding,
        timezone=tz,
        priority=Priority.parse(priority),
        max_attempts=max_attempts,
        missed=MissedFires(missed).value,
        headers=dict(headers or {}),
        enabled=enabled,
    )


def same_definition(a: Schedule, b: Schedule) -> bool:
    """Whether two schedule records define the same schedule (``created_at`` aside)."""
    return replace(a, created_at=0) == replace(b, created_at=0)


def payload_text(schedule: Schedule) -> str:
    """The payload for display: JSON text, or ``<N bytes AVRO>``."""
    if schedule.payload_encoding.value == "JSON":
        try:
            return json.dumps(json.loads(schedule.payload), separators=(",", ":"))
        except ValueError:
            pass
    return f"<{len(schedule.payload)} bytes {schedule.payload_encoding.value}>"


# --- the <ns>.schedules table ---------------------------------------------------------------


def _producer(settings: Settings) -> Any:
    from confluent_kafka import Producer

    from ._producer import producer_config

    conf = producer_config(settings)
    conf["linger.ms"] = 0
    return Producer(conf)


def _write(settings: Settings, records: list[tuple[str, bytes | None]], timeout: float) -> None:
    producer = _producer(settings)
    topic = TopicNames(settings.namespace).schedules
    errors: list[str] = []

    def on_delivery(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(error.str())

    for key, value in records:
        producer.produce(topic, value, key.encode(), on_delivery=on_delivery)
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


def publish_schedules(
    settings: Settings, schedules: list[Schedule], timeout: float = 30.0
) -> list[str]:
    """Write ``schedules`` to ``<ns>.schedules``, skipping the unchanged; return names written."""
    current = read_schedules(settings, timeout=timeout) if schedules else {}
    codec = ScheduleCodec()
    stamp = now_ms()
    changed = [
        s for s in schedules if s.name not in current or not same_definition(s, current[s.name])
    ]
    _write(
        settings, [(s.name, codec.encode(replace(s, created_at=stamp))) for s in changed], timeout
    )
    return [s.name for s in changed]


def delete_schedule(settings: Settings, name: str, timeout: float = 30.0) -> bool:
    """Tombstone schedule ``name``; False when no such schedule exists."""
    if name not in read_schedules(settings, timeout=timeout):
        return False
    _write(settings, [(name, None)], timeout)
    return True


def read_table(
    settings: Settings, topic: str, timeout: float = 30.0
) -> list[tuple[str, bytes | None]]:
    """Every committed message of ``topic`` from its beginning to its end, as (key, value)."""
    import time

    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    conf: dict[str, Any] = {
        "group.id": f"{settings.namespace}.table-reader",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        **settings.client_config(),
    }
    consumer = Consumer(conf)
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=timeout)
        except KafkaException as exc:
            raise KafkaUnavailableError(
                f"Kafka at {settings.bootstrap_servers} did not answer: {exc.args[0].str()}"
            ) from exc
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None:
            raise KafkaUnavailableError(
                f"topic {topic} does not exist; create the topics with `pipeline topics apply`"
            )
        tps = [TopicPartition(topic, p, -2) for p in sorted(meta.partitions)]
        pending = set()
        for tp in tps:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
            if high > low:
                pending.add(tp.partition)
        records: list[tuple[str, bytes | None]] = []
        if not pending:
            return records
        consumer.assign([tp for tp in tps if tp.partition in pending])
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(f"reading {topic} took longer than {timeout:g}s")
            for message in consumer.consume(1000, 0.2):
                error = message.error()
                if error is None:
                    key = message.key()
                    records.append((key.decode() if key else "", message.value()))
                elif error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(message.partition())
                else:
                    raise KafkaUnavailableError(f"reading {topic} failed: {error.str()}")
        return records
    finally:
        consumer.close()


def read_schedules(settings: Settings, timeout: float = 30.0) -> dict[str, Schedule]:
    """Every schedule on ``<ns>.schedules``, by name (undecodable records are left out)."""
    codec = ScheduleCodec()
    table: dict[str, Schedule] = {}
    for key, value in read_table(settings, TopicNames(settings.namespace).schedules, timeout):
        if value is None:
            table.pop(key, None)
            continue
        try:
            table[key] = codec.decode(value)
        except DecodeError:
            continue
    return table
