"""Operations on one stored schedule: pause, resume, and trigger a fire now.

One place for them, called by ``pipeline schedules pause|resume|trigger`` and by any other
front end (a web dashboard): each takes the settings and the schedule's name, reads
``<ns>.schedules`` and raises :class:`ScheduleNotFoundError` for a name that is not there.

Pausing and resuming republish the schedule's record with ``enabled`` false or true and
``created_at`` now. The scheduler counts a schedule's fires from the later of its last fire and
its record's ``created_at`` (:func:`~pipeline._schedule.count_from`), so a fire whose time fell
while the schedule was paused never fires on resume, whatever its missed-fire policy; fires
missed after the resume while no scheduler ran follow the policy as usual. Both are idempotent:
pausing a paused schedule writes nothing. There is no compare-and-set on a Kafka topic: a
pause racing a ``schedules add`` of the same name ends as the last write says.

:func:`trigger_schedule` enqueues one fire now, outside the cron timing, whether the schedule is
paused or not: the job the scheduler would enqueue for a fire (:func:`~pipeline._schedule.
fire_job`, with the defaults of a type the scheduler does not know) plus the header
``pipeline-trigger: manual``. Its idempotency key is ``manual:<name>:<at_ms>``, which no cron
fire's (``cron:<name>:<ms>``) can equal, so a second trigger with the same ``at_ms`` (a form
submitted twice) is dropped by the workers' deduplication (within the job type's ``dedup_ttl``).
Its job id is a fresh one, not derived: two copies of one job id are the same job to a worker,
which runs a copy read while the first one is still pending (as a retry), so only a distinct id
with the same key is deduplicated in every case.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ._codec import ScheduleCodec
from ._delivery import JobHandle
from ._envelopes import job_codec
from ._errors import PipelineError, ScheduleNotFoundError
from ._job import Job, new_job_id, now_ms
from ._producer import KafkaTransport
from ._schedule import fire_job
from ._scheduletable import _write, read_schedule_records
from ._topics import TopicNames

if TYPE_CHECKING:
    from ._records import Schedule
    from ._settings import Settings

__all__ = [
    "TRIGGER_HEADER",
    "ScheduleNotFoundError",
    "find_schedule",
    "pause_schedule",
    "resume_schedule",
    "trigger_idempotency_key",
    "trigger_job",
    "trigger_schedule",
]

TRIGGER_HEADER = "pipeline-trigger"
"""The header of a job enqueued by :func:`trigger_schedule` (value ``manual``)."""


def trigger_idempotency_key(name: str, at_ms: int) -> str:
    """The idempotency (and partition) key of the manual fire of ``name`` requested at ``at_ms``.

    Cron fire keys start with ``cron:``, these with ``manual:``: they never meet.
    """
    return f"manual:{name}:{at_ms}"


def trigger_job(schedule: Schedule, namespace: str, at_ms: int, default_max_attempts: int) -> Job:
    """The job a manual fire of ``schedule`` enqueues: a cron fire's, with its own id and key.

    It runs now (no ``not_before``); priority and max attempts follow the schedule, else the
    defaults, as the scheduler does for a job type it does not know.
    """
    fired = fire_job(schedule, namespace, at_ms, default_max_attempts)
    return replace(
        fired,
        id=new_job_id(),
        idempotency_key=trigger_idempotency_key(schedule.name, at_ms),
        not_before=None,
        headers={**fired.headers, TRIGGER_HEADER: "manual"},
    )


def find_schedule(settings: Settings, name: str, timeout: float = 30.0) -> Schedule:
    """Schedule ``name`` as stored on ``<ns>.schedules``.

    Raises :class:`ScheduleNotFoundError` when there is none, :class:`PipelineError` when its
    record is invalid (``pipeline schedules ls`` shows why).
    """
    record = read_schedule_records(settings, timeout=timeout).get(name)
    if record is None:
        raise ScheduleNotFoundError(name)
    if record.problem is not None or record.schedule is None:
        raise PipelineError(  # what the topic holds, not what the command was given
            f"schedule {name!r} is invalid ({record.problem}); add it again with "
            "`pipeline schedules add` or remove it with `pipeline schedules rm`"
        )
    return record.schedule


def pause_schedule(settings: Settings, name: str, timeout: float = 30.0) -> bool:
    """Stop schedule ``name`` from firing; False when it was paused already (nothing written)."""
    return _set_enabled(settings, name, False, timeout)


def resume_schedule(settings: Settings, name: str, timeout: float = 30.0) -> bool:
    """Let schedule ``name`` fire again from now on; False when it was not paused.

    The fires whose time fell while it was paused are never fired, whatever its missed policy.
    """
    return _set_enabled(settings, name, True, timeout)


def _set_enabled(settings: Settings, name: str, enabled: bool, timeout: float) -> bool:
    schedule = find_schedule(settings, name, timeout)
    if schedule.enabled == enabled:
        return False
    record = replace(schedule, enabled=enabled, created_at=now_ms())
    _write(settings, [(name, ScheduleCodec().encode(record))], timeout)
    return True


def trigger_schedule(
    settings: Settings, name: str, at_ms: int | None = None, timeout: float = 30.0
) -> Job:
    """Enqueue one fire of schedule ``name`` now and return its job, once Kafka acknowledged it.

    ``at_ms`` (default: now) names the request: calls with the same ``at_ms`` run the job once,
    so a front end passes the time its form was rendered. Works for a paused schedule too.
    """
    schedule = find_schedule(settings, name, timeout)
    at = now_ms() if at_ms is None else at_ms
    job = trigger_job(schedule, settings.namespace, at, settings.producer.default_max_attempts)
    codec = job_codec(settings)
    transport = KafkaTransport(settings)
    handle = JobHandle(transport, settings)
    handle.job_id = job.id
    try:
        key = (job.idempotency_key or "").encode()
        topic = TopicNames(settings.namespace).jobs(job.priority)
        transport.produce(topic, codec.encode(job), key, handle._on_delivery)
        handle.wait(timeout)
    finally:
        transport.close()
        if codec.framing is not None:
            codec.framing.close()
    return job
