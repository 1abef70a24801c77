"""Job envelopes in a schema registry's wire format (``schema_registry.url``, ``.envelope``):
read whenever a value is framed, written when the settings say so.

A producer's first framed write registers ``pipeline.Job`` and waits for the id; a service's
writes (:func:`service_codec`) never wait for the registry: see :class:`EnvelopeFraming`.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from ._avro import HEADER_SIZE
from ._avrogen import INT_MAX, INT_MIN
from ._codec import JobCodec
from ._errors import DecodeError
from ._redact import redact_url
from ._schemaregistry import SchemaRegistry, frame

if TYPE_CHECKING:
    from ._avroschema import RegisteredSchema
    from ._settings import Settings

__all__ = ["EnvelopeFraming", "job_codec", "service_codec"]

log = logging.getLogger("pipeline.schemaregistry")


class EnvelopeFraming:
    """Job envelopes in the registry's wire format: read always, written when ``writes``.

    Written envelopes carry the id of ``pipeline.Job`` under ``subject``, registered at the
    first write. Any reader with the registry reads them; one without it dead-letters them.

    ``background``: a service's writes (a worker's retries and dead letters, the scheduler's
    cron fires), which must not wait for the registry, nor fail when it is down: until the id
    is known they are written single-object, which every reader reads, and the id is registered
    on a thread of its own, waiting the registry out as a reader does. A producer's first
    write waits for the id instead (up to ``wait_s``, then fails), as its caller expects.
    """

    def __init__(
        self, registry: SchemaRegistry, subject: str, *, writes: bool, background: bool = False
    ) -> None:
        self.registry = registry
        self.subject = subject
        self.writes = writes
        self.background = background
        self._id: int | None = None
        self._registering: threading.Thread | None = None

    def read(self, data: bytes, reader: RegisteredSchema) -> Any:
        # A Job holds times as int milliseconds, even if a producer registered the envelope's
        # schema with a logicalType (the binary is the same).
        record = self.registry.read(data, reader, logical_types=False)
        _check_ints(record, data)
        return record

    def write(self, single_object: bytes, schema: RegisteredSchema) -> bytes:
        """``single_object`` (as the store wrote it) with the registry's frame instead."""
        if self._id is None:
            if self.background:
                self._register_soon(schema)
                return single_object
            self._id = self.registry.register(self.subject, schema.schema)
        return frame(self._id, single_object[HEADER_SIZE:])

    def in_background(self) -> EnvelopeFraming:
        """This framing for a service's writes (see the class); the registry is shared."""
        return EnvelopeFraming(self.registry, self.subject, writes=self.writes, background=True)

    def _register_soon(self, schema: RegisteredSchema) -> None:
        if self._registering is not None:
            return
        self._registering = threading.Thread(
            target=self._register, args=(schema,), name="pipeline-registry", daemon=True
        )
        self._registering.start()

    def _register(self, schema: RegisteredSchema) -> None:
        """Until the registry answers (its own retries, each one said); a refusal for good
        (an incompatible schema, credentials) leaves the envelopes single-object, said once."""
        try:
            self._id = self.registry.register(self.subject, schema.schema, until_answered=True)
        except Exception as exc:
            log.error(
                "the schema registry refused the job envelope's schema: this process writes "
                "single-object envelopes, which every reader reads",
                extra={"url": self.registry.shown_url, "error": redact_url(str(exc))},
            )

    def close(self) -> None:
        self.registry.close()


def job_codec(settings: Settings) -> JobCodec:
    """The job codec of these settings: with the registry's framing when a URL is set."""
    registry_settings = settings.schema_registry
    if not registry_settings.url:
        return JobCodec()
    subject = registry_settings.envelope_subject or f"{settings.namespace}.jobs-value"
    registry = SchemaRegistry.from_settings(registry_settings)
    return JobCodec(framing=EnvelopeFraming(registry, subject, writes=registry_settings.envelope))


INT_FIELDS = ("attempt", "max_attempts")
"""The Avro ``int`` fields of ``pipeline.Job`` (and ``attempt`` of each of its errors)."""


def _check_ints(record: dict[str, Any], data: bytes) -> None:
    """fastavro reads an Avro ``int`` past 32 bits without a word (this library's own reader
    refuses one): such a job would decode and run, then neither its retry nor its dead letter
    could be encoded, and its partition stood still behind it. Checked here, not by walking
    the whole record against its schema, which cost 40% of a framed decode."""
    values = [(name, record.get(name)) for name in INT_FIELDS]
    values += [("errors[].attempt", error.get("attempt")) for error in record.get("errors") or ()]
    for name, value in values:
        if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
            raise DecodeError(
                f"the pipeline.Job's {name} is {value}, past an Avro int (32 bits)", bytes(data)
            )


def service_codec(codec: JobCodec) -> JobCodec:
    """``codec`` for a service's writes: framed envelopes are registered in the background
    (see :class:`EnvelopeFraming`); any other codec as it is."""
    framing = codec.framing
    if not isinstance(framing, EnvelopeFraming) or not framing.writes:
        return codec
    return JobCodec(codec.store, framing=framing.in_background())
