"""Dead letters for what the leader cannot read on ``<ns>.deferred`` or a wait tier, and for
a delayed job it cannot send on.

A letter carries the message's raw bytes, so the letter is larger than the message. When that
makes it larger than the producer sends (``message.max.bytes``), the letter goes without the
value and the headers and says so: a transaction holding a message the producer refuses could
never commit, and every delayed job read with it would wait for ever. For the same reason a
valid delayed job larger than the producer sends (another producer, allowed larger messages,
wrote it) is not released but dead-lettered (``too_large``), without its bytes: the letter
says where they stay. So is a cron fire whose job would be larger than the producer sends (the
schedule's record fits, the fire adds its id, key and header): the schedule goes on.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from confluent_kafka import Message

from pipeline._codec import DeadLetterCodec
from pipeline._errors import DecodeError
from pipeline._job import Job
from pipeline._producer import fits_in_message
from pipeline._records import DeadLetter, DeadLetterReason, stored_headers

__all__ = ["DeadLetters"]

_log = logging.getLogger("pipeline.scheduler")


class DeadLetters:
    """Encodes the dead letter of an undecodable message, within ``max_bytes``."""

    def __init__(self, codec: DeadLetterCodec, max_bytes: int, schedules_topic: str = "") -> None:
        self._codec = codec
        self._max_bytes = max_bytes
        self.schedules_topic = schedules_topic

    def encode(self, message: Message, exc: DecodeError) -> bytes:
        """The value of ``message``'s dead letter (its key stays the message's key)."""
        value = message.value()
        letter = DeadLetter(
            reason=DeadLetterReason.DECODE_ERROR,
            message=exc.reason,
            source_topic=message.topic() or "",
            source_partition=message.partition() or 0,
            source_offset=message.offset() or 0,
            raw_value=value,
            raw_key=message.key(),
            raw_headers=stored_headers(message.headers()),
        )
        encoded = self._codec.encode(letter)
        if fits_in_message(self._max_bytes, encoded, message.key()):
            return encoded
        size = len(value or b"")
        note = (
            f"{exc.reason}; its {size}-byte value left out (and its headers): with them the "
            f"dead letter would exceed the producer's message.max.bytes ({self._max_bytes})"
        )
        _log.warning("dead letter too large: raw value left out", extra={"bytes": size})
        return self._codec.encode(replace(letter, message=note, raw_value=None, raw_headers={}))

    def too_large(
        self, job: Job, source: tuple[str, int], offset: int, key: bytes | None, size: int
    ) -> bytes:
        """The letter of delayed ``job`` (``size`` bytes at ``source``, ``offset``), which the
        producer refuses to send on: without the job, which would not fit either."""
        topic, partition = source
        letter = DeadLetter(
            reason=DeadLetterReason.TOO_LARGE,
            message=(
                f"delayed job of {size} bytes is larger than the scheduler sends "
                f"(message.max.bytes {self._max_bytes}), so it was not released; its bytes stay "
                f"on {topic}[{partition}] at offset {offset} until the topic's retention"
            ),
            source_topic=topic,
            source_partition=partition,
            source_offset=offset,
            job_id=job.id,
            job_type=job.type,
            tenant=job.tenant,
            raw_key=key,
        )
        _log.warning("delayed job too large to release: dead-lettered", extra={"bytes": size})
        return self._codec.encode(letter)

    def fire_too_large(self, job: Job, name: str, offset: int, size: int) -> bytes:
        """The letter of the fire ``job`` of schedule ``name`` (its record at ``offset`` of
        ``source_topic``), ``size`` bytes encoded: not enqueued, the schedule goes on."""
        letter = DeadLetter(
            reason=DeadLetterReason.TOO_LARGE,
            message=(
                f"the fire of schedule {name!r} at {job.not_before} ms is a job of {size} bytes, "
                f"larger than the scheduler sends (message.max.bytes {self._max_bytes}), so it "
                "was not enqueued; make the schedule's payload smaller"
            ),
            source_topic=self.schedules_topic,
            source_partition=0,
            source_offset=offset,
            job_id=job.id,
            job_type=job.type,
            tenant=job.tenant,
            raw_key=(job.idempotency_key or "").encode(),
        )
        _log.warning("cron fire too large to enqueue: dead-lettered", extra={"schedule": name})
        return self._codec.encode(letter)
