"""Payloads and envelopes in a Confluent-compatible Schema Registry's wire format.

Shops that run a registry (Confluent Schema Registry, Apicurio Registry in its ``ccompat``
mode, Karapace) write Kafka values as ``00``, a 4-byte schema id and the Avro body. Two
opt-in uses, each one setting or one argument away:

- **Payloads, per job type**: ``@app.job("invoice.render", payload=RegistryAvroPayload(schema,
  registry=SchemaRegistry(url)))``. Enqueue validates the arguments, registers the schema
  under ``subject`` (once per process; the registry applies the subject's compatibility rule)
  and writes the framed payload; the worker resolves the writer schema by id (fetched once,
  cached) into ``schema``. Payloads a producer wrote in single-object encoding still read.
- **Envelopes, per namespace**: ``schema_registry.url`` makes the worker and the scheduler read
  envelopes in the registry's format next to single-object ones, so a Java or Go producer may
  use its registry serializer for the whole ``pipeline.Job`` value; ``schema_registry.envelope``
  makes this library write them too.

An unknown schema id is dead-lettered, naming the id (``validation_error`` for a payload: the
job was read; ``decode_error`` for an envelope); a registry that does
not answer pauses the reader until it does, and fails an enqueue with
:class:`SchemaRegistryUnavailableError` after ``wait_s``. Needs the ``registry`` extra.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ._avro import HEADER_SIZE, SchemaStore
from ._avroschema import SchemaSource
from ._codec import AvroPayload
from ._envelopes import EnvelopeFraming, job_codec
from ._errors import DecodeError
from ._schemaregistry import (
    MAGIC,
    SchemaRegistry,
    SchemaRegistryUnavailableError,
    frame,
)

__all__ = [
    "EnvelopeFraming",
    "RegistryAvroPayload",
    "SchemaRegistry",
    "SchemaRegistryUnavailableError",
    "job_codec",
]


class RegistryAvroPayload(AvroPayload):
    """An :class:`~pipeline.AvroPayload` whose payloads carry a registry schema id.

    ``subject`` defaults to ``<schema full name>-value``: one subject per payload type,
    whatever the topic (Confluent's ``RecordNameStrategy`` would say ``<schema full name>``).
    ``other_versions`` are read from single-object payloads only; the registry resolves the
    rest.
    """

    def __init__(
        self,
        schema: SchemaSource,
        *,
        registry: SchemaRegistry | str,
        subject: str | None = None,
        other_versions: Iterable[SchemaSource] = (),
        store: SchemaStore | None = None,
    ) -> None:
        super().__init__(schema, other_versions=other_versions, store=store)
        self.registry = SchemaRegistry(registry) if isinstance(registry, str) else registry
        self.subject = subject or f"{self.schema.full_name}-value"
        self._id: int | None = None

    def __repr__(self) -> str:
        return f"RegistryAvroPayload({self.schema.full_name}, subject={self.subject!r})"

    @property
    def schema_id(self) -> int:
        """The registry's id of ``schema`` under ``subject``, registered at first use."""
        if self._id is None:
            self._id = self.registry.register(self.subject, self.schema.schema)
        return self._id

    def encode(self, job_type: str, payload: Mapping[str, Any]) -> bytes:
        """Raises :class:`PayloadValidationError` for bad arguments, before the registry is
        asked; then :class:`ConfigurationError` if the registry refuses the schema, or
        :class:`SchemaRegistryUnavailableError` if it does not answer."""
        body = super().encode(job_type, payload)[HEADER_SIZE:]
        return frame(self.schema_id, body)

    def decode(self, job_type: str, data: bytes) -> dict[str, Any]:
        if data[:1] != MAGIC:
            return super().decode(job_type, data)
        record = self.registry.read(data, self.schema)
        if not isinstance(record, dict):
            raise DecodeError(f"payload of job type {job_type!r} is not a record", bytes(data))
        return record
