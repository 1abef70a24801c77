"""Codecs: records of the wire contract to bytes and back, and job payload codecs.

:class:`JobCodec`, :class:`DeadLetterCodec`, :class:`EventCodec` and :class:`ScheduleCodec` map
a dataclass to its Avro record (``schemas/pipeline/*.avsc``) and use :class:`SchemaStore` for the
single-object encoding. Decoding raises :class:`DecodeError` (with the raw bytes) and nothing
else, so a consumer can dead-letter what it cannot read and move on.

A :class:`PayloadCodec` turns a job's arguments into the envelope's ``payload`` bytes:
:class:`JsonPayload` (the default) or :class:`AvroPayload` (a schema per job type).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from fastavro.validation import ValidationError, validate

from ._avro import SchemaStore
from ._avrogen import python_default
from ._avroschema import RegisteredSchema, SchemaSource
from ._errors import ConfigurationError, DecodeError, EncodeError, PayloadValidationError
from ._job import AttemptError, Job, PayloadEncoding, Priority
from ._jsonpayload import JsonPayload
from ._records import DeadLetter, Event, Schedule

__all__ = [
    "AvroPayload",
    "DeadLetterCodec",
    "EventCodec",
    "JobCodec",
    "JsonPayload",
    "PayloadCodec",
    "RecordCodec",
    "ScheduleCodec",
]

T = TypeVar("T")

_PRIORITIES = {p.value: p for p in Priority}
_ENCODINGS = {e.value: e for e in PayloadEncoding}


class Framing(Protocol):
    """Another wire format for records next to single-object encoding (a schema registry's)."""

    writes: bool
    """Whether encoding writes this format; decoding reads it whenever a value starts with 00."""

    def read(self, data: bytes, reader: RegisteredSchema) -> Any: ...

    def write(self, single_object: bytes, schema: RegisteredSchema) -> bytes: ...

    def close(self) -> None: ...


class RecordCodec(Generic[T]):
    """Encodes and decodes one record type of the wire contract as its current schema version.

    Subclasses name the record (``full_name``) and map values to and from Avro dicts.
    Decoding reads any known writer version (schema resolution by fingerprint), and with a
    ``framing`` also values in that framing's format (see :mod:`pipeline.schemaregistry`).
    """

    full_name: ClassVar[str]

    def __init__(self, store: SchemaStore | None = None, *, framing: Framing | None = None) -> None:
        self.store = store if store is not None else SchemaStore()
        self.schema = self.store.latest(self.full_name)
        self.framing = framing

    def encode(self, value: T) -> bytes:
        data = self.store.encode(self.to_record(value), self.schema)
        if self.framing is not None and self.framing.writes:
            return self.framing.write(data, self.schema)
        return data

    def decode(self, data: bytes) -> T:
        """Raises :class:`DecodeError` for anything that is not a valid record of this type."""
        if self.framing is not None and data[:1] == b"\x00":
            record = self.framing.read(data, self.schema)
        else:
            record = self.store.decode(data, self.schema)
        try:
            return self.from_record(record)
        except DecodeError as exc:  # a nested record (the job inside a dead letter)
            raise DecodeError(f"invalid {self.full_name}: {exc.reason}", bytes(data)) from exc
        except (KeyError, ValueError, TypeError) as exc:
            raise DecodeError(f"invalid {self.full_name}: {exc}", bytes(data)) from exc

    def to_record(self, value: T) -> dict[str, Any]:
        raise NotImplementedError

    def from_record(self, record: dict[str, Any]) -> T:
        raise NotImplementedError


class JobCodec(RecordCodec[Job]):
    """:class:`Job` <-> ``pipeline.Job`` (the value of every job, retry and deferred message)."""

    full_name = "pipeline.Job"

    def to_record(self, value: Job) -> dict[str, Any]:
        return {
            "id": value.id,
            "type": value.type,
            "payload": value.payload,
            "payload_encoding": value.payload_encoding.value,
            "priority": value.priority.value,
            "attempt": value.attempt,
            "max_attempts": value.max_attempts,
            "created_at": value.created_at,
            "not_before": value.not_before,
            "idempotency_key": value.idempotency_key,
            "tenant": value.tenant,
            "headers": value.headers,
            "errors": [_attempt_error_record(e) for e in value.errors] if value.errors else [],
        }

    def from_record(self, record: dict[str, Any]) -> Job:
        priority = _PRIORITIES.get(record["priority"])
        if priority is None:
            raise ValueError(
                f"unknown priority {record['priority']!r} (job {record['id']}); this reader knows "
                f"{', '.join(_PRIORITIES)}: upgrade it to read jobs of newer priorities"
            )
        attempt = record["attempt"]
        max_attempts = record["max_attempts"]
        if attempt < 1 or max_attempts < 1:
            # A foreign producer's 0 or negative would buy runs beyond max_attempts (each
            # retry counts up from it), or make a meaningless limit: the library writes neither.
            raise ValueError(
                f"attempt and max_attempts must be at least 1, got attempt {attempt} and "
                f"max_attempts {max_attempts} (job {record['id']})"
            )
        errors = record["errors"]
        return Job(
            id=record["id"],
            type=record["type"],
            payload=record["payload"],
            payload_encoding=_ENCODINGS[record["payload_encoding"]],
            priority=priority,
            attempt=attempt,
            max_attempts=max_attempts,
            created_at=record["created_at"],
            not_before=record["not_before"],
            idempotency_key=record["idempotency_key"],
            tenant=record["tenant"],
            headers=record["headers"],
            errors=[AttemptError(**e) for e in errors] if errors else [],
        )


def _attempt_error_record(error: AttemptError) -> dict[str, Any]:
    return {
        "attempt": error.attempt,
        "at": error.at,
        "error_class": error.error_class,
        "message": error.message,
        "retryable": error.retryable,
        "traceback_digest": error.traceback_digest,
        "worker": error.worker,
    }


class DeadLetterCodec(RecordCodec[DeadLetter]):
    """:class:`DeadLetter` <-> ``pipeline.DeadLetter``; the job inside is a nested Job message."""

    full_name = "pipeline.DeadLetter"

    def __init__(self, store: SchemaStore | None = None) -> None:
        super().__init__(store)
        self.jobs = JobCodec(self.store)

    def to_record(self, value: DeadLetter) -> dict[str, Any]:
        return {
            "id": value.id,
            "job_id": value.job_id,
            "job_type": value.job_type,
            "job": None if value.job is None else self.jobs.encode(value.job),
            "raw_value": value.raw_value,
            "raw_key": value.raw_key,
            "raw_headers": value.raw_headers,
            "reason": str(value.reason),
            "error_class": value.error_class,
            "message": value.message,
            "source_topic": value.source_topic,
            "source_partition": value.source_partition,
            "source_offset": value.source_offset,
            "dead_at": value.dead_at,
            "tenant": value.tenant,
            "traceback": value.traceback,
        }

    def from_record(self, record: dict[str, Any]) -> DeadLetter:
        job_bytes = record.pop("job")
        job = None if job_bytes is None else self.jobs.decode(job_bytes)
        return DeadLetter(job=job, **record)


class EventCodec(RecordCodec[Event]):
    """:class:`Event` <-> ``pipeline.Event`` (the value of every ``<ns>.events`` message)."""

    full_name = "pipeline.Event"

    def to_record(self, value: Event) -> dict[str, Any]:
        return {
            "job_id": value.job_id,
            "job_type": value.job_type,
            "kind": str(value.kind),
            "at": value.at,
            "attempt": value.attempt,
            "priority": str(value.priority),
            "worker": value.worker,
            "duration_ms": value.duration_ms,
            "progress": value.progress,
            "detail": value.detail,
        }

    def from_record(self, record: dict[str, Any]) -> Event:
        # Another producer's NaN or infinity (Avro doubles carry them) is no figure: readers
        # print events as JSON, which has no such numbers, and sort and sum their durations.
        duration, progress = record["duration_ms"], record["progress"]
        if duration is not None and not math.isfinite(duration):
            record["duration_ms"] = None
        if progress is not None and not 0.0 <= progress <= 1.0:  # NaN too
            record["progress"] = None
        return Event(**record)


class ScheduleCodec(RecordCodec[Schedule]):
    """:class:`Schedule` <-> ``pipeline.Schedule`` (the values of ``<ns>.schedules``)."""

    full_name = "pipeline.Schedule"

    def to_record(self, value: Schedule) -> dict[str, Any]:
        return {
            "name": value.name,
            "cron": value.cron,
            "timezone": value.timezone,
            "job_type": value.job_type,
            "payload": value.payload,
            "payload_encoding": value.payload_encoding.value,
            "priority": (value.priority or Priority.DEFAULT).value,
            "priority_from_type": value.priority is None,
            "max_attempts": value.max_attempts,
            "missed": str(value.missed),
            "headers": value.headers,
            "idempotency_ttl_s": value.idempotency_ttl_s,
            "created_at": value.created_at,
            "enabled": value.enabled,
        }

    def from_record(self, record: dict[str, Any]) -> Schedule:
        priority = _PRIORITIES.get(record["priority"])
        if priority is None:
            raise ValueError(
                f"schedule {record['name']!r}: unknown priority {record['priority']!r}"
            )
        record["priority"] = None if record.pop("priority_from_type") else priority
        record["payload_encoding"] = _ENCODINGS[record["payload_encoding"]]
        return Schedule(**record)


# -- payload codecs ----------------------------------------------------------------------------


class PayloadCodec(Protocol):
    """Turns a job's arguments into the envelope's ``payload`` bytes and back.

    ``encode`` raises :class:`PayloadValidationError`, naming the bad field, before anything is
    sent; ``decode`` raises :class:`DecodeError`.
    """

    @property
    def encoding(self) -> PayloadEncoding: ...

    def encode(self, job_type: str, payload: Mapping[str, Any]) -> bytes: ...

    def decode(self, job_type: str, data: bytes) -> dict[str, Any]: ...


class AvroPayload:
    """Payloads written with an Avro record schema, themselves in single-object encoding.

    ``schema`` (a dict, a JSON string or an ``.avsc`` path: a ``Path`` or a ``str``) is what
    this codec writes and reads as. ``other_versions`` are the other versions of it whose
    payloads it must read too, older or newer, resolved into ``schema`` by Avro's rules
    (readers find writer schemas by fingerprint, so a version nobody listed is a
    :class:`SchemaNotFoundError`). The codec has its own :class:`SchemaStore` unless given
    one; its own keeps logical types, so a ``timestamp-millis`` field reads as an aware
    ``datetime``.
    """

    encoding = PayloadEncoding.AVRO

    def __init__(
        self,
        schema: SchemaSource,
        *,
        other_versions: Iterable[SchemaSource] = (),
        store: SchemaStore | None = None,
    ) -> None:
        self.store = store if store is not None else SchemaStore.empty(logical_types=True)
        for other in other_versions:
            self.store.register(other)
        self.schema = self.store.register(schema)
        fields = self.schema.schema.get("fields")
        if self.schema.schema.get("type") != "record" or not isinstance(fields, list):
            raise ConfigurationError(
                f"a payload schema must be a record (the job's keyword arguments), "
                f"got {self.schema.full_name}"
            )
        self._fields = frozenset(f["name"] for f in fields)
        self._required = frozenset(f["name"] for f in fields if "default" not in f)
        self._defaults = {f["name"]: python_default(f) for f in fields if "default" in f}

    def __repr__(self) -> str:
        return f"AvroPayload({self.schema.full_name} v{self.schema.version})"

    def encode(self, job_type: str, payload: Mapping[str, Any]) -> bytes:
        payload = self.checked(job_type, payload)
        try:
            return self.store.encode(payload, self.schema)
        except EncodeError as exc:
            raise PayloadValidationError(job_type, str(exc)) from exc

    def checked(self, job_type: str, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        """``payload`` with its defaults filled in, validated against ``schema``."""
        if not isinstance(payload, Mapping):
            raise PayloadValidationError(
                job_type, f"payload must be a mapping, got {type(payload).__name__}"
            )
        keys = payload.keys()
        if keys != self._fields:
            payload = self._complete(job_type, payload)
        try:
            validate(payload, self.schema.parsed, raise_errors=True)
        except ValidationError as exc:  # names each bad field: "acme.Email.to is <5> ..."
            problems = "; ".join(map(str, getattr(exc, "errors", ()))) or str(exc)
            raise PayloadValidationError(job_type, problems) from exc
        except Exception as exc:
            raise PayloadValidationError(job_type, f"{type(exc).__name__}: {exc}") from exc
        return payload

    def _complete(self, job_type: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        keys = set(payload)
        unknown = sorted(map(str, keys - self._fields))
        if unknown:
            raise PayloadValidationError(
                job_type,
                f"unknown field(s) {', '.join(map(repr, unknown))} for {self.schema.full_name}",
            )
        missing = sorted(self._required - keys)
        if missing:
            raise PayloadValidationError(
                job_type,
                f"missing field(s) {', '.join(map(repr, missing))} of {self.schema.full_name}",
            )
        return {**{k: v for k, v in self._defaults.items() if k not in keys}, **payload}

    def decode(self, job_type: str, data: bytes) -> dict[str, Any]:
        """Reads payloads written with ``schema`` or any of ``other_versions``."""
        record = self.store.decode(data, self.schema)
        if not isinstance(record, dict):
            raise DecodeError(f"payload of job type {job_type!r} is not a record", bytes(data))
        return record
