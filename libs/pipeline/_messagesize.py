"""How large a Kafka message the producers send: librdkafka's ``message.max.bytes``.

librdkafka refuses a larger record at once (inside a transaction, that aborts it), so the jobs
are measured before they are produced, and a job too large is refused with an error that says
what to do instead.
"""

from __future__ import annotations

from ._errors import ConfigurationError, PayloadValidationError
from ._settings import Settings

__all__ = [
    "LIBRDKAFKA_MESSAGE_MAX_BYTES",
    "PRODUCE_OVERHEAD",
    "RECORD_OVERHEAD",
    "enqueue_room",
    "fits_in_message",
    "message_max_bytes",
    "too_large",
]

LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``: the largest message a producer sends."""


def message_max_bytes(settings: Settings) -> int:
    """The largest message (value, key and headers) the services' producers send: librdkafka
    refuses a larger one at once, which inside a transaction aborts it."""
    limit = settings.kafka.get("message.max.bytes", LIBRDKAFKA_MESSAGE_MAX_BYTES)
    return int(limit)


RECORD_OVERHEAD = 512
"""Room left for what a record adds to its value, key and headers, where a record is written
in a transaction later than it is checked (the outbox, moves, dead letters). The broker
measures a record *batch* (61 bytes of header and the record's own fields, up to 36 bytes)
against the topic's ``max.message.bytes``: where that equals the producer's
``message.max.bytes`` (both raised together), a record within :data:`PRODUCE_OVERHEAD` is taken
by librdkafka and refused by the broker (measured: value and key of ``message.max.bytes - 36``
bytes refused, of ``- 72`` written), which fails the whole transaction, every time it is tried.
An enqueue, which fails alone then, keeps librdkafka's own bound."""
PRODUCE_OVERHEAD = 36
"""What librdkafka itself adds to a record's value, key and headers when it checks
``message.max.bytes`` as it takes the record (measured: with no key nor headers, a value of
``message.max.bytes - 36`` bytes is taken, one byte more refused): the bound of an enqueue,
which produces at once, so that every job librdkafka would take is taken."""


def enqueue_room(max_bytes: int, key: bytes | None) -> int:
    """The largest encoded job an enqueue with ``key`` produces at once to a producer sending
    at most ``max_bytes``: librdkafka's own bound (:data:`PRODUCE_OVERHEAD`)."""
    return max_bytes - PRODUCE_OVERHEAD - len(key or b"")


def fits_in_message(max_bytes: int, value: bytes, key: bytes | None, headers_size: int = 0) -> bool:
    """Whether a record of ``value``, ``key`` and ``headers_size`` bytes of headers is one a
    producer sending at most ``max_bytes`` (:func:`message_max_bytes`) takes."""
    return len(value) + len(key or b"") + headers_size + RECORD_OVERHEAD <= max_bytes


def too_large(
    job_type: str, size: int, max_bytes: int, *, idempotency_key: int = 0
) -> PayloadValidationError | ConfigurationError:
    """The error for a job of ``size`` bytes (value and key) that a producer sending at most
    ``max_bytes`` refuses. ``idempotency_key``: the size of the job's idempotency key, which
    its message carries twice (as the message key and in the job); a :class:`ConfigurationError`
    when the job is too large for that key alone (it would fit with a short one)."""
    limit = f"more than the {max_bytes:,} the producer sends (message.max.bytes)"
    if not idempotency_key:
        return PayloadValidationError(
            job_type,
            f"the job takes {size:,} bytes and more as a Kafka message, {limit}: keep large "
            "data elsewhere and pass a reference",
        )
    keys = 2 * idempotency_key
    held = f"its idempotency key is {idempotency_key:,} bytes, which the message carries twice"
    if size - keys + PRODUCE_OVERHEAD <= max_bytes:
        return ConfigurationError(
            f"a job of type {job_type!r} with this idempotency key takes {size:,} bytes and "
            f"more as a Kafka message, {limit}: {held} (as the message key and in the job): "
            "pass a shorter key (a digest of this one, for instance)"
        )
    return PayloadValidationError(
        job_type,
        f"the job takes {size:,} bytes and more as a Kafka message, {limit} ({held}, "
        f"{keys:,} bytes of it): keep large data elsewhere and pass a reference",
    )
