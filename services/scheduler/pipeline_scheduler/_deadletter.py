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

from confluent_kafka import Message

from pipeline import _letters as letters
from pipeline._codec import DeadLetterCodec
from pipeline._errors import DecodeError
from pipeline._job import Job

__all__ = ["DeadLetters"]

_log = logging.getLogger("pipeline.scheduler")


class DeadLetters:
    """Encodes the scheduler's dead letters (see :mod:`pipeline._letters`), within ``max_bytes``."""

    def __init__(self, codec: DeadLetterCodec, max_bytes: int, schedules_topic: str = "") -> None:
        self._codec = codec
        self._max_bytes = max_bytes
        self.schedules_topic = schedules_topic

    def encode(self, message: Message, exc: DecodeError) -> bytes:
        """The value of ``message``'s dead letter (its key: :meth:`key`)."""
        return letters.undecodable(self._codec, message, exc.reason, self._max_bytes)

    def key(self, key: bytes | None) -> bytes | None:
        """The Kafka key of the letter of a message keyed ``key`` (see
        :func:`pipeline._letters.letter_key`)."""
        return letters.letter_key(key, self._max_bytes)

    def too_large(
        self, job: Job, source: tuple[str, int], offset: int, key: bytes | None, size: int
    ) -> bytes:
        """The letter of delayed ``job`` (``size`` bytes at ``source``, ``offset``), which the
        producer refuses to send on: without the job, which would not fit either."""
        topic, partition = source
        why = (
            f"delayed job of {size} bytes is larger than the scheduler sends "
            f"(message.max.bytes {self._max_bytes}), so it was not released; its bytes stay on "
            f"{letters.place(topic, partition, offset)} until the topic's retention"
        )
        _log.warning("delayed job too large to release: dead-lettered", extra={"bytes": size})
        return letters.too_large(
            self._codec, job, why, source=(topic, partition, offset), key=key,
            max_bytes=self._max_bytes,
        )  # fmt: skip

    def fire_too_large(self, job: Job, name: str, where: tuple[int, int], size: int) -> bytes:
        """The letter of the fire ``job`` of schedule ``name`` (its record at ``where``,
        partition and offset, of ``source_topic``), ``size`` bytes encoded: not enqueued, the
        schedule goes on."""
        why = (
            f"the fire of schedule {name!r} at {job.not_before} ms is a job of {size} bytes, "
            f"larger than the scheduler sends (message.max.bytes {self._max_bytes}), so it was "
            "not enqueued; make the schedule's payload smaller"
        )
        _log.warning("cron fire too large to enqueue: dead-lettered", extra={"schedule": name})
        source = (self.schedules_topic, *where)
        key = (job.idempotency_key or "").encode()
        return letters.too_large(
            self._codec, job, why, source=source, key=key, max_bytes=self._max_bytes
        )
