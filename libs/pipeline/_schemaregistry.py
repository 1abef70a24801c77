"""A Confluent-compatible Schema Registry: schemas registered and resolved by id, with caching.

The registry's wire format is a zero byte, the schema id as 4 big-endian bytes, then the Avro
binary body. :class:`SchemaRegistry` wraps confluent-kafka's ``SchemaRegistryClient`` (the REST
API and its caches) and adds what a job system needs around it: a writer schema parsed once per
id, an incompatible schema reported as a :class:`ConfigurationError` naming the subject, an
unknown id as a :class:`SchemaNotFoundError` (the message is dead-lettered), and an unreachable
registry waited out rather than turned into dead letters. :mod:`._envelopes` puts job
envelopes in that format and reads them back.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Callable, Mapping
from io import BytesIO
from typing import TYPE_CHECKING, Any

import fastavro

from ._avroschema import RegisteredSchema, body_error, canonical_form, strip_logical_types
from ._errors import ConfigurationError, DecodeError, PipelineError, SchemaNotFoundError
from ._redact import redact_url

if TYPE_CHECKING:
    from ._registrysettings import SchemaRegistrySettings

__all__ = [
    "MAGIC",
    "SchemaRegistry",
    "SchemaRegistryUnavailableError",
    "frame",
]

log = logging.getLogger("pipeline.schemaregistry")

MAGIC = b"\x00"
"""The first byte of every value in the registry's wire format."""
FRAME_SIZE = 5
_ID = struct.Struct(">I")
_RETRY_FIRST_S, _RETRY_MAX_S = 0.5, 10.0
_REQUEST_TIMEOUT_S = 5.0
"""The longest one HTTP request may take (the client's own default is no limit at all)."""
_BUSY = frozenset({408, 429})
"""Client error statuses that mean "not now" (timeout, rate limit): waited out like a 5xx."""
_REFUSED = frozenset({401, 403})
"""The registry refused this client's credentials: a reader waits them out (see ``_call``)."""
_NOT_FOUND = frozenset({40401, 40402, 40403})
"""The registry's own "not found" codes (subject, version, schema). A 404 without one is not
its answer: the URL's path is wrong (Apicurio without ``/apis/ccompat/v7``), and a reader
waits it out, as a refusal, rather than dead-letter every job as of an unknown schema."""


def _misrouted(exc: Exception) -> bool:
    return (
        getattr(exc, "http_status_code", None) == 404
        and getattr(exc, "error_code", None) not in _NOT_FOUND
    )


class SchemaRegistryUnavailableError(PipelineError):
    """The schema registry did not answer (down, wrong URL, network): nothing was sent."""


def frame(schema_id: int, body: bytes) -> bytes:
    """A value in the registry's wire format."""
    return MAGIC + _ID.pack(schema_id) + body


def schema_id_of(data: bytes) -> int:
    if len(data) < FRAME_SIZE or data[:1] != MAGIC:
        raise DecodeError(
            f"not in the schema registry's wire format: {len(data)} byte(s) starting with "
            f"{bytes(data[:2]).hex(' ') or 'nothing'}, expected 00 and a 4-byte schema id",
            bytes(data),
        )
    return int(_ID.unpack_from(data, 1)[0])


class SchemaRegistry:
    """One registry, by URL; ``client`` holds options for ``SchemaRegistryClient`` as they are.

    ``wait_s`` bounds how long registering (at a producer's first write) waits for an
    unreachable registry before it raises :class:`SchemaRegistryUnavailableError`.
    ``read_wait_s`` bounds the lookup of a writer schema the same way; ``None`` (the default)
    waits as long as it takes, which is what a worker wants: it pauses rather than dead-letter
    jobs it could read a minute later. Unless ``client`` says otherwise, one request times out
    after 5 s (or ``wait_s``, if shorter) and the client does not retry on its own: this class
    retries, so that a registry that never answers is given up on after about ``wait_s``.
    """

    def __init__(
        self,
        url: str,
        *,
        client: Mapping[str, Any] | None = None,
        wait_s: float | None = 10.0,
        read_wait_s: float | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        try:
            from confluent_kafka.schema_registry import SchemaRegistryClient
        except ImportError as exc:  # the optional extra is not installed
            raise ConfigurationError(
                f"the schema registry mode needs confluent-kafka's registry client ({exc}): "
                "pip install 'kafka-pipeline[registry]'"
            ) from exc
        self.url = url
        self.shown_url = redact_url(url)
        """``url`` as messages and logs show it: without a password in it."""
        self.wait_s = wait_s
        self.read_wait_s = read_wait_s
        self._sleep = sleep
        timeout = _REQUEST_TIMEOUT_S
        if wait_s is not None and wait_s > 0:
            timeout = min(wait_s, _REQUEST_TIMEOUT_S)
        self.options: dict[str, Any] = {
            "url": url,
            "timeout": timeout,
            "max.retries": 0,
            **(client or {}),
        }
        """What ``SchemaRegistryClient`` was given: ``client`` over this class's defaults."""
        for each in url.split(","):
            if not each.strip().lower().startswith(("http://", "https://")):
                # Not shown: a URL without its scheme may still carry a password.
                raise ConfigurationError(
                    "the schema registry's URL must start with http:// or https:// (each of "
                    "them, comma-separated)"
                )
        try:
            self.client = SchemaRegistryClient(dict(self.options))
        except (ValueError, TypeError) as exc:  # an unknown option, or one of the wrong type
            raise ConfigurationError(
                f"the schema registry client refused its options: {redact_url(str(exc))}"
            ) from None
        self._writers: dict[tuple[int, bool], Any] = {}
        self._canonical: dict[int, str] = {}
        """Each writer's Parsing Canonical Form: the same as a reader's, the same binary."""
        self._ids: dict[tuple[str, str], int] = {}

    @classmethod
    def from_settings(cls, settings: SchemaRegistrySettings, **kwargs: Any) -> SchemaRegistry:
        if not settings.url:
            raise ConfigurationError("schema_registry.url is not set")
        return cls(settings.url, client=settings.client, **kwargs)

    def __repr__(self) -> str:
        return f"SchemaRegistry({self.shown_url!r})"

    def close(self) -> None:
        """Closes the HTTP connections; safe to call twice."""
        self.client.close()

    def __enter__(self) -> SchemaRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------

    def register(
        self, subject: str, schema: Mapping[str, Any], *, until_answered: bool = False
    ) -> int:
        """The id of ``schema`` under ``subject``, registering it (once per process) if new.

        The registry applies the subject's compatibility rule; a schema it refuses raises a
        :class:`ConfigurationError` that names the subject and the registry's reason. An
        unreachable registry is waited out for ``wait_s`` (``until_answered``: for good).
        """
        text = _schema_text(schema)
        known = self._ids.get((subject, text))
        if known is not None:
            return known
        from confluent_kafka.schema_registry import Schema

        try:
            schema_id = int(
                self._call(
                    lambda: self.client.register_schema(subject, Schema(text, "AVRO")),
                    None if until_answered else self.wait_s,
                )
            )
        except _registry_error() as exc:
            raise self._refused(subject, schema, exc) from exc
        self._ids[(subject, text)] = schema_id
        # The schema of that id is the one just sent: reading what was written with it (the
        # enqueue checks the payload as the handler gets it) asks the registry nothing more.
        # confluent-kafka's client does not serve a lookup by id from what it registered.
        self._parsed(schema_id, json.loads(text))
        return schema_id

    def _refused(self, subject: str, schema: Mapping[str, Any], exc: Exception) -> Exception:
        """What an enqueue raises when the registry refused to register ``schema``: a settings
        error saying which setting to look at (nothing was sent)."""
        status = getattr(exc, "http_status_code", None)
        reason = redact_url(str(getattr(exc, "error_message", None) or exc))
        refused = f"the schema registry at {self.shown_url} refused {schema.get('name')!r} under "
        if status in (409, 422):
            fix = (
                "evolve the schema by the subject's compatibility rule, or register it under a "
                "new subject"
            )
        elif status in _REFUSED:
            fix = "check the credentials in schema_registry.client (basic.auth.user.info)"
        elif _misrouted(exc):
            fix = (
                "the URL answers 404 for the registry's API: is its path right? (Apicurio's "
                "is /apis/ccompat/v7)"
            )
        else:
            fix = "nothing was sent"
        return ConfigurationError(f"{refused}subject {subject!r}: {reason} (HTTP {status}); {fix}")

    def compatible(self, subject: str, schema: Mapping[str, Any]) -> bool:
        """Whether the registry would accept ``schema`` as the next version of ``subject``."""
        from confluent_kafka.schema_registry import Schema

        text = _schema_text(schema)
        try:
            return bool(
                self._call(
                    lambda: self.client.test_compatibility(subject, Schema(text, "AVRO")),
                    self.wait_s,
                )
            )
        except _registry_error() as exc:
            if getattr(exc, "http_status_code", None) == 404:  # no such subject: anything goes
                return True
            raise

    # -- reading -------------------------------------------------------------------------

    def writer(self, schema_id: int, *, logical_types: bool = True) -> Any:
        """The writer schema of ``schema_id``, parsed by fastavro; fetched once per id.

        fastavro reads a value as its writer's ``logicalType`` says; without ``logical_types``
        they are left out, so that times read as the plain ``long`` milliseconds of a reader
        that has none (a job envelope), whatever a producer put in the schema it registered.
        """
        parsed = self._writers.get((schema_id, logical_types))
        if parsed is not None:
            return parsed
        try:
            found = self._call(
                lambda: self.client.get_schema(schema_id), self.read_wait_s, refusals_wait=True
            )
        except _registry_error() as exc:
            if getattr(exc, "http_status_code", None) == 404 and not _misrouted(exc):
                raise SchemaNotFoundError(
                    f"schema id {schema_id} is not in the schema registry at {self.shown_url}",
                    b"",
                ) from exc
            raise
        if found.schema_type not in (None, "AVRO"):
            raise SchemaNotFoundError(
                f"schema id {schema_id} is a {found.schema_type} schema, not Avro", b""
            )
        try:
            self._parsed(schema_id, json.loads(found.schema_str))
        except Exception as exc:  # e.g. references to other subjects, which are not supported
            raise SchemaNotFoundError(
                f"schema id {schema_id} of the schema registry at {self.shown_url} cannot be read "
                f"as an Avro schema: {type(exc).__name__}: {exc}",
                b"",
            ) from exc
        return self._writers[(schema_id, logical_types)]

    def _parsed(self, schema_id: int, raw: Any) -> None:
        """Keeps schema ``raw`` as the writer of ``schema_id``, with and without its logical
        types, and its canonical form."""
        self._writers[(schema_id, True)] = fastavro.parse_schema(raw)
        self._writers[(schema_id, False)] = fastavro.parse_schema(strip_logical_types(raw))
        self._canonical[schema_id] = canonical_form(raw)

    def read(self, data: bytes, reader: RegisteredSchema, *, logical_types: bool = True) -> Any:
        """Decodes a value in the registry's wire format as ``reader`` (Avro resolution);
        ``logical_types`` as :meth:`writer` takes it."""
        schema_id = schema_id_of(data)
        try:
            writer = self.writer(schema_id, logical_types=logical_types)
        except SchemaNotFoundError as exc:
            raise SchemaNotFoundError(exc.reason, bytes(data)) from exc
        except _registry_error() as exc:
            # Refused for good (a 400 or 422, say, from a proxy in between): a message no
            # reader can read, dead-lettered with why (the scheduler and the retry relay expect
            # a DecodeError of a message, and stopped on this).
            raise DecodeError(
                f"the schema registry at {self.shown_url} refused the lookup of schema id "
                f"{schema_id}: {redact_url(str(exc))}",
                bytes(data),
            ) from exc
        if logical_types and self._canonical.get(schema_id) == reader.canonical_form:
            # The same binary: read as the reader's own version, with its logical types (a
            # Java producer's timestamp-millis is the handler's plain long, and the reverse).
            writer = reader.parsed
        buffer = BytesIO(data)
        buffer.seek(FRAME_SIZE)
        try:
            record = fastavro.schemaless_reader(buffer, writer, reader.parsed)
        except Exception as exc:
            raise DecodeError(
                f"cannot decode a {reader.full_name} written with registry schema id "
                f"{schema_id}: {body_error(exc)}",
                bytes(data),
            ) from exc
        if buffer.tell() != len(data):
            raise DecodeError(
                f"{len(data) - buffer.tell()} unexpected bytes after the {reader.full_name} body "
                f"(registry schema id {schema_id})",
                bytes(data),
            )
        return record

    def _call(
        self, request: Callable[[], Any], wait_s: float | None, *, refusals_wait: bool = False
    ) -> Any:
        """``request``, retried with backoff while the registry cannot be reached.

        ``refusals_wait`` (a reader's lookups): a refusal of the credentials (401, 403) is
        retried too, as loudly, rather than raised: every job read meanwhile would be
        dead-lettered for what is a setting to fix, and none of them is wrong."""
        started = time.monotonic()
        delay = _RETRY_FIRST_S
        while True:
            try:
                return request()
            except _registry_error() as exc:
                status = getattr(exc, "http_status_code", None)
                refused = status in _REFUSED or _misrouted(exc)
                waits = status in _BUSY or (refusals_wait and refused)
                if status is not None and 0 < status < 500 and not waits:
                    raise
                problem: Exception = exc
            except Exception as exc:  # connection refused, DNS, TLS, timeouts: the transport's
                problem = exc
            waited = time.monotonic() - started
            if wait_s is not None and waited >= wait_s:
                raise SchemaRegistryUnavailableError(
                    f"the schema registry at {self.shown_url} did not answer for {waited:.0f}s: "
                    f"{type(problem).__name__}: {redact_url(str(problem))}"
                ) from problem
            if _misrouted(problem):
                said = "schema registry URL answers 404 for the registry's API (is its path right?)"
            elif getattr(problem, "http_status_code", None) in _REFUSED:
                said = "schema registry refused the credentials (schema_registry.client)"
            else:
                said = "schema registry unreachable"
            log.warning(
                f"{said}, retrying",
                extra={
                    "url": self.shown_url,
                    "retry_in_s": delay,
                    "error": redact_url(str(problem)),
                },
            )
            self._sleep(delay)
            delay = min(delay * 2, _RETRY_MAX_S)


def _schema_text(schema: Mapping[str, Any]) -> str:
    """The one JSON text of a schema this library sends (so a repeat is found in the cache)."""
    return json.dumps(schema, separators=(",", ":"), sort_keys=True)


def _registry_error() -> type[Exception]:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    return SchemaRegistryError
