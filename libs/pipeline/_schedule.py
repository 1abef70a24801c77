"""Cron schedules in code: validation, fire ids, and the ``<ns>.schedules`` table.

A schedule is a :class:`pipeline._records.Schedule` record (the wire contract) keyed by its name
on the compacted ``<ns>.schedules`` topic; a tombstone removes it. ``pipeline-scheduler`` fires
them. Everything here except :func:`publish_schedules`, :func:`delete_schedule` and the readers
is pure: fire times come from :mod:`pipeline._cronexpr`, and a fire's job id and idempotency key
are derived from (namespace, name, fire time) so a fire enqueues exactly once.

:func:`check_schedule` is the one validation of a schedule: writers (:func:`make_schedule`,
hence ``app.schedule(...)`` and ``pipeline schedules add``) refuse what it refuses, and readers
(the scheduler, ``pipeline schedules ls``) see such a record as invalid, with the reason.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ._clientlog import LastProblemLog
from ._codec import JsonPayload, PayloadCodec, ScheduleCodec
from ._cronexpr import due_fires, fires_between, moment, next_fire_ms, validate_schedule
from ._errors import (
    ConfigurationError,
    DecodeError,
    KafkaUnavailableError,
    PipelineError,
    TopicMissingError,
)
from ._job import Job, Priority, now_ms
from ._partitions import topic_partitions, unavailable
from ._records import MissedFires, Schedule
from ._topics import TopicNames

if TYPE_CHECKING:
    from ._registry import JobOptions, JobType
    from ._settings import Settings

__all__ = [
    "FIRE_ID_NAMESPACE",
    "ScheduleRecord",
    "check_schedule",
    "count_from",
    "decode_schedule",
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
    "read_schedule_records",
    "read_schedules",
    "read_table",
    "same_definition",
    "save_schedules",
    "validate_schedule",
]

FIRE_ID_NAMESPACE = uuid.UUID("5b0f1c2e-6a1d-5d3e-9c53-7f1e0c1a9b21")
"""The uuid5 namespace of fire job ids (fixed forever: changing it would re-fire)."""

_JSON = JsonPayload()


def fire_job_id(namespace: str, name: str, fire_ms: int) -> str:
    """The job id of one fire: 32 hex digits, the same in every scheduler process."""
    return uuid.uuid5(FIRE_ID_NAMESPACE, f"{namespace}\x00{name}\x00{fire_ms}").hex


def fire_idempotency_key(name: str, fire_ms: int) -> str:
    return f"cron:{name}:{fire_ms}"


def fire_job(
    schedule: Schedule,
    namespace: str,
    fire_ms: int,
    default_max_attempts: int,
    declared: JobOptions | None = None,
) -> Job:
    """The job one fire of ``schedule`` enqueues (its id and key derive from the fire time).

    Its priority and max attempts are the schedule's when it names them, else those the job
    type declares (``declared``, where the scheduler knows the type), else the defaults.
    """
    headers = dict(schedule.headers)
    headers.setdefault("pipeline-schedule", schedule.name)
    priority = schedule.priority
    if priority is None:
        priority = declared.priority if declared is not None else Priority.DEFAULT
    max_attempts = schedule.max_attempts
    if max_attempts is None and declared is not None:
        max_attempts = declared.max_attempts
    return Job(
        id=fire_job_id(namespace, schedule.name, fire_ms),
        type=schedule.job_type,
        payload=schedule.payload,
        payload_encoding=schedule.payload_encoding,
        priority=priority,
        max_attempts=max_attempts if max_attempts is not None else default_max_attempts,
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
    priority: Priority | str | None = None,
    max_attempts: int | None = None,
    headers: Mapping[str, str] | None = None,
    registered: JobType | None = None,
    enabled: bool = True,
) -> Schedule:
    """A :class:`Schedule` that :func:`check_schedule` accepts, or :class:`ConfigurationError`.

    A mapping payload is encoded as JSON, or with the payload codec of ``registered`` (the job
    type, when the application knows it), whose handler must accept it. ``priority`` and
    ``max_attempts`` left ``None`` are the job type's declared ones at every fire.
    """
    codec: PayloadCodec = _JSON
    if registered is not None:
        codec = registered.options.payload or _JSON
        if not isinstance(payload, bytes):
            registered.check_payload(payload or {})
    data = payload if isinstance(payload, bytes) else codec.encode(job_type, payload or {})
    try:
        parsed = Priority.parse(priority) if priority is not None else None
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    schedule = Schedule(
        name=name,
        cron=cron,
        job_type=job_type,
        payload=data,
        payload_encoding=codec.encoding,
        timezone=tz,
        priority=parsed,
        max_attempts=max_attempts,
        missed=str(missed),
        headers=dict(headers or {}),
        enabled=enabled,
    )
    check_schedule(schedule)
    return schedule


def check_schedule(schedule: Schedule, now: int | None = None) -> None:
    """Raise :class:`ConfigurationError` unless ``schedule`` can be fired as it is.

    Its name, cron expression, time zone and missed-fire policy must be usable, its
    ``created_at`` a time of years 1 to 9999, its ``max_attempts`` at least 1, and the
    expression must fire within
    :data:`~pipeline._cronexpr.MAX_YEARS_BETWEEN_FIRES` years after ``now``.
    """
    name = schedule.name
    if not name or "\x00" in name:
        raise ConfigurationError(f"invalid schedule name {name!r}")
    if not schedule.job_type.strip():
        raise ConfigurationError(f"schedule {name!r} has an empty job type")
    validate_schedule(schedule.cron, schedule.timezone, schedule.missed)
    moment(schedule.created_at)  # where a new schedule's fires count from
    if schedule.max_attempts is not None and schedule.max_attempts < 1:
        raise ConfigurationError(f"max_attempts must be at least 1, got {schedule.max_attempts}")
    next_fire_ms(schedule.cron, schedule.timezone, now_ms() if now is None else now)


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """One record of ``<ns>.schedules`` as a reader finds it: a schedule, or why it is unusable.

    ``schedule`` is None when the bytes do not decode; ``problem`` is None for a valid one.
    """

    name: str
    schedule: Schedule | None
    problem: str | None = None


def decode_schedule(name: str, value: bytes, codec: ScheduleCodec) -> ScheduleRecord:
    """Decode and check the record stored under key ``name``; never raises for bad input."""
    try:
        schedule = codec.decode(value)
    except DecodeError as exc:
        return ScheduleRecord(name, None, f"undecodable record: {exc.reason}")
    if schedule.name != name:
        return ScheduleRecord(
            name, schedule, f"the record's name {schedule.name!r} differs from its key"
        )
    try:
        check_schedule(schedule)
    except ConfigurationError as exc:
        return ScheduleRecord(name, schedule, str(exc))
    return ScheduleRecord(name, schedule)


def same_definition(a: Schedule, b: Schedule) -> bool:
    """Whether two schedule records define the same schedule (``created_at`` aside)."""
    return replace(a, created_at=0) == replace(b, created_at=0)


def count_from(schedule: Schedule, last_fire_ms: int | None) -> int:
    """The time after which ``schedule``'s next fires are due: the later of its last fire and
    the moment its record was written (``created_at``: when it was added, changed or resumed).

    So a resumed schedule never fires for the times it was paused, whatever its missed policy,
    and a changed one never fires for times before it existed; fires missed after that moment
    (no scheduler ran) follow the policy.
    """
    if last_fire_ms is None:
        return schedule.created_at
    return max(last_fire_ms, schedule.created_at)


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
    # librdkafka's own lines only explain a failure the error raised says already: kept at
    # DEBUG, as the backlog reader keeps them (a command run while Kafka is down printed
    # hundreds of them before its one-line error).
    conf["logger"] = LastProblemLog()
    return Producer(conf)


def _write(settings: Settings, records: list[tuple[str, bytes | None]], timeout: float) -> None:
    from confluent_kafka import KafkaException

    producer = _producer(settings)
    topic = TopicNames(settings.namespace).schedules
    errors: list[str] = []

    def on_delivery(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(error.str())

    for key, value in records:
        try:
            producer.produce(topic, value, key.encode(), on_delivery=on_delivery)
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


def read_table(
    settings: Settings, topic: str, timeout: float = 30.0, *, missing_ok: bool = False
) -> list[tuple[str, bytes | None]]:
    """Every committed message of ``topic`` from its beginning to its end, as (key, value);
    with ``missing_ok``, none when the topic does not exist (else :class:`TopicMissingError`).
    A refusal of the credentials raises at once, not after ``timeout`` (see
    :mod:`pipeline._partitions`)."""
    import time

    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    conf: dict[str, Any] = {
        "logger": LastProblemLog(),  # see _producer
        "group.id": f"{settings.namespace}.table-reader",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        # The end is known when a fetch at it comes back empty: the broker's default wait for
        # data there (500 ms) would hold up every reading, a standby's takeover among them.
        "fetch.wait.max.ms": 10,
        **settings.client_config(),
    }
    consumer = Consumer(conf)
    deadline = time.monotonic() + timeout  # for the whole read, not each step of it
    try:
        try:
            partitions = topic_partitions(
                consumer, conf["logger"], settings, topic, deadline=deadline, timeout=timeout
            )
        except TopicMissingError:
            if missing_ok:
                return []
            raise
        tps = [TopicPartition(topic, p, -2) for p in partitions]
        try:
            pending = _not_empty(consumer, tps, deadline)
        except KafkaException as exc:  # the metadata came, a partition's leader did not
            reason = f"the end of {topic}: {exc.args[0].str()}"
            raise unavailable(consumer, conf["logger"], settings, timeout, reason) from exc
        records: list[tuple[str, bytes | None]] = []
        if not pending:
            return records
        consumer.assign([tp for tp in tps if tp.partition in pending])
        while pending:
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(f"reading {topic} took longer than {timeout:g}s")
            # poll() returns at the first message (or end of partition); consume(n, 0) takes
            # what is there. consume(n, timeout) would wait out its timeout for n messages.
            first = consumer.poll(0.2)
            for message in [first, *consumer.consume(1000, 0)] if first is not None else []:
                error = message.error()
                if error is None:
                    key = message.key()
                    # A key that is not UTF-8 is no key of ours; it must not stop the reader.
                    name = key.decode(errors="replace") if key else ""
                    records.append((name, message.value()))
                elif error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(message.partition())
                else:
                    raise KafkaUnavailableError(f"reading {topic} failed: {error.str()}")
        return records
    finally:
        consumer.close()


def _not_empty(consumer: Any, tps: list[Any], deadline: float) -> set[int]:
    """The partitions of ``tps`` that hold messages, asked by ``time.monotonic()`` ``deadline``."""
    import time

    found = set()
    for tp in tps:
        low, high = consumer.get_watermark_offsets(
            tp, timeout=max(0.1, deadline - time.monotonic())
        )
        if high > low:
            found.add(tp.partition)
    return found


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
