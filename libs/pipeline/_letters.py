"""The dead letters a service writes for a message it cannot pass on, within what its producer
sends: the scheduler (delayed jobs, cron fires) and the worker's retry relay both write them.

A transaction holding a message its producer refuses can never commit: a service that tried
would stop at every start, with every message behind that one. So an undecodable message is
dead-lettered with its raw bytes only when they fit (:func:`undecodable`), and a job larger than
the producer sends is dead-lettered without them (:func:`too_large`); either letter says where
the bytes stay (their topic, partition and offset, until the topic's retention). A letter goes
keyed by its message's key and holds that key too (``raw_key``): twice a key over half of what
the producer sends would not fit, so such a letter goes without a Kafka key
(:func:`letter_key`), and leaves its copy out too where with it the letter would not fit
(:func:`keyed_within`).
"""

from __future__ import annotations

import logging
from dataclasses import replace

from confluent_kafka import Message

from ._codec import DeadLetterCodec
from ._job import Job
from ._producer import fits_in_message
from ._records import DeadLetter, DeadLetterReason, stored_headers

__all__ = ["keyed_within", "letter_key", "place", "too_large", "undecodable"]

_log = logging.getLogger("pipeline.deadletters")


def place(topic: str, partition: int, offset: int) -> str:
    """Where a message's bytes stay, as a letter says it."""
    return f"{topic}[{partition}] at offset {offset}"


def letter_key(key: bytes | None, max_bytes: int) -> bytes | None:
    """The Kafka key of a letter about a message keyed ``key``: that key, unless it takes more
    than half of what the producer sends (``max_bytes``; another producer allowed larger
    messages): then none, or the letter with its copy of the key would not fit, and the producer
    would refuse it, aborting every transaction that held it."""
    return key if key is None or 2 * len(key) <= max_bytes else None


def keyed_within(
    codec: DeadLetterCodec, letter: DeadLetter, key: bytes | None, max_bytes: int
) -> bytes:
    """``letter`` encoded, to go keyed by :func:`letter_key` of ``key`` (its ``raw_key``):
    without that copy of the key when with it the record would exceed ``max_bytes``, which the
    producer would refuse, aborting every transaction that held it."""
    key = letter_key(key, max_bytes)
    encoded = codec.encode(letter)
    if letter.raw_key is None or fits_in_message(max_bytes, encoded, key):
        return encoded
    _log.warning(
        "dead letter too large: its copy of the key left out", extra={"bytes": len(key or b"")}
    )
    return codec.encode(replace(letter, raw_key=None))


def undecodable(codec: DeadLetterCodec, message: Message, reason: str, max_bytes: int) -> bytes:
    """The ``decode_error`` letter of ``message``: with its raw bytes and headers when they fit
    in ``max_bytes`` (the producer's ``message.max.bytes``), else without them."""
    value = message.value()
    source = (message.topic() or "", message.partition() or 0, message.offset() or 0)
    letter = DeadLetter(
        reason=DeadLetterReason.DECODE_ERROR,
        message=reason,
        source_topic=source[0],
        source_partition=source[1],
        source_offset=source[2],
        raw_value=value,
        raw_key=message.key(),
        raw_headers=stored_headers(message.headers()),
    )
    encoded = codec.encode(letter)
    if fits_in_message(max_bytes, encoded, letter_key(message.key(), max_bytes)):
        return encoded
    size = len(value or b"")
    note = (
        f"{reason}; its {size}-byte value left out (and its headers): with them the dead letter "
        f"would exceed the producer's message.max.bytes ({max_bytes}); they stay on "
        f"{place(*source)}"
    )
    _log.warning("dead letter too large: raw value left out", extra={"bytes": size})
    lean = replace(letter, message=note, raw_value=None, raw_headers={})
    return keyed_within(codec, lean, message.key(), max_bytes)


def too_large(
    codec: DeadLetterCodec,
    job: Job,
    why: str,
    *,
    source: tuple[str, int, int],
    key: bytes | None,
    max_bytes: int,
) -> bytes:
    """The ``too_large`` letter of ``job``, which the producer refuses to send on: ``why`` (what
    was not done, and where the bytes stay), without the job, which would not fit either;
    ``source`` is (topic, partition, offset) of what it was read from; it goes keyed by
    ``key`` (see :func:`keyed_within`)."""
    topic, partition, offset = source
    letter = DeadLetter(
        reason=DeadLetterReason.TOO_LARGE,
        message=why,
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        job_id=job.id,
        job_type=job.type,
        tenant=job.tenant,
        raw_key=key,
    )
    return keyed_within(codec, letter, key, max_bytes)
