"""Cron schedules in code: validation, fire ids and fire jobs, records as readers find them.

A schedule is a :class:`pipeline._records.Schedule` record (the wire contract) keyed by its name
on the compacted ``<ns>.schedules`` topic; a tombstone removes it. ``pipeline-scheduler`` fires
them. Everything here is pure (writing and reading the topic is :mod:`pipeline._scheduletable`'s):
fire times come from :mod:`pipeline._cronexpr`, and a fire's job id and idempotency key
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

from ._codec import ScheduleCodec
from ._cronexpr import due_fires, fires_between, moment, next_fire_ms, validate_schedule
from ._errors import ConfigurationError, DecodeError
from ._job import Job, Priority, now_ms
from ._jsonpayload import read_json
from ._messagesize import fits_in_message
from ._records import MissedFires, Schedule
from ._route import PayloadRoute

if TYPE_CHECKING:
    from ._registry import JobOptions, JobType

__all__ = [
    "FIRE_ID_NAMESPACE",
    "ScheduleRecord",
    "check_schedule",
    "count_from",
    "decode_schedule",
    "due_fires",
    "fire_idempotency_key",
    "fire_job",
    "fire_job_id",
    "fires_between",
    "make_schedule",
    "next_fire_ms",
    "payload_text",
    "same_definition",
    "validate_schedule",
]

FIRE_ID_NAMESPACE = uuid.UUID("5b0f1c2e-6a1d-5d3e-9c53-7f1e0c1a9b21")
"""The uuid5 namespace of fire job ids (fixed forever: changing it would re-fire)."""


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
    max_bytes: int | None = None,
) -> Schedule:
    """A :class:`Schedule` that :func:`check_schedule` accepts, or :class:`ConfigurationError`
    (:class:`PayloadValidationError` for a payload the handler would refuse, as at enqueue).
    ``max_bytes``: the largest message the producer writing it sends (its record must fit:
    Kafka would refuse it at every write, the scheduler's at every takeover).

    A mapping payload is encoded as JSON, or with the payload codec of ``registered`` (the job
    type, when the application knows it), whose handler must accept it. ``priority`` and
    ``max_attempts`` left ``None`` are the job type's declared ones at every fire.
    """
    payloads = PayloadRoute.of(job_type, registered)  # checked and encoded as enqueue does it
    codec = payloads.payload_codec
    data = payload if isinstance(payload, bytes) else payloads.payload_bytes(payload or {})
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
    if max_bytes is not None:
        value, key = ScheduleCodec().encode(schedule), name.encode()
        if not fits_in_message(max_bytes, value, key):
            size = len(value) + len(key)
            raise ConfigurationError(
                f"schedule {name} takes {size} bytes, too many for one message of at most "
                f"{max_bytes} with its overhead (`kafka.message.max.bytes`): give it a smaller "
                "payload"
            )
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
            return json.dumps(read_json(schedule.payload), separators=(",", ":"))
        except ValueError:
            pass
    return f"<{len(schedule.payload)} bytes {schedule.payload_encoding.value}>"
