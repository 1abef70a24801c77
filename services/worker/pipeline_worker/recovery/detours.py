"""Where the retry relay sends a tier's message that it cannot return to its priority topic.

- A job due far later than its tier allows (written by another producer, or by a worker whose
  clock is far off) would hold its tier partition, and every job behind it, until then. It is
  forwarded unchanged to ``<ns>.deferred`` instead, where the scheduler holds long delays, as
  the worker does with a job read long before its ``not_before``
  (:mod:`..dispatch.holds`). "Far": later than the longest delay the worker gives a job of that
  tier (the next tier's delay; twice its own for the last tier) plus :data:`AHEAD_MARGIN_MS`.
- A message that does not decode is dead-lettered with its raw bytes (``decode_error``);
  without them when they would make the letter larger than the relay's producer sends.
- A job the producer refuses as larger than its ``message.max.bytes`` (a worker allowed larger
  messages wrote it) is dead-lettered (``too_large``) without its bytes: the letter says where
  they stay. A transaction holding a refused message could never commit, and the relay would
  stop at every start, with every retried job behind it.
"""

from __future__ import annotations

import logging

from confluent_kafka import Message

from pipeline import Job, Settings
from pipeline import _letters as letters
from pipeline._codec import DeadLetterCodec
from pipeline._producer import message_max_bytes
from pipeline._ratelog import RateLimitedLog
from pipeline._topics import TopicNames

__all__ = ["AHEAD_MARGIN_MS", "Detours"]

_log = logging.getLogger("pipeline.worker.relay")

AHEAD_MARGIN_MS = 60_000
"""How much later than its tier's longest delay a job may be due and still wait on the tier
(clocks of worker hosts that disagree by up to this much change nothing)."""


class Detours:
    """The relay's judgement of far-ahead jobs and its dead letters (see the module docstring)."""

    def __init__(self, settings: Settings, codec: DeadLetterCodec) -> None:
        names = TopicNames(settings.namespace)
        delays_ms = [int(d * 1000) for d in settings.topics.retry_delays_s]
        longest = [*delays_ms[1:], 2 * delays_ms[-1]] if delays_ms else []
        self._ahead_max_ms = {
            names.retry(tier): delay + AHEAD_MARGIN_MS for tier, delay in enumerate(longest)
        }
        self.deferred = names.deferred
        self._codec = codec
        self.max_bytes = message_max_bytes(settings)
        self._log = RateLimitedLog(_log, interval_s=10.0)

    def too_far(self, message: Message, job: Job, now_ms: int) -> bool:
        """Whether ``job``, read from a tier as ``message`` at ``now_ms``, is due too far
        ahead to wait there, and goes to ``<ns>.deferred`` (logged, rate-limited)."""
        topic = message.topic() or ""
        ahead_ms = (job.not_before or 0) - now_ms
        if ahead_ms <= self._ahead_max_ms.get(topic, 0):
            return False
        self._log.warning(
            "too far",
            "%s is due in %.0f s, later than tier %s ever delays a job: moved to %s, the "
            "scheduler releases it when due",
            _where(message), ahead_ms / 1000, topic, self.deferred,
            extra={"job_id": job.id, "job_type": job.type},
        )  # fmt: skip
        return True

    def undecodable(self, message: Message, reason: str) -> bytes:
        """The dead letter of ``message``, which does not decode: with its raw bytes and
        headers when they fit in what the producer sends, else without them."""
        return letters.undecodable(self._codec, message, reason, self.max_bytes)

    def too_large(self, job: Job, message: Message, target: str) -> bytes:
        """The dead letter of ``job`` (``message``), which the producer refused to send to
        ``target``: without the job, which would not fit either."""
        size = len(message.value() or b"")
        why = (
            f"retried job of {size} bytes is larger than the retry relay sends "
            f"(message.max.bytes {self.max_bytes}), so it was not returned to {target}; its "
            f"bytes stay on {_where(message)} until the topic's retention"
        )
        _log.warning(
            "retried job too large to return: dead-lettered",
            extra={"job_id": job.id, "bytes": size},
        )
        source = (message.topic() or "", message.partition() or 0, message.offset() or 0)
        return letters.too_large(
            self._codec, job, why, source=source, key=message.key(), max_bytes=self.max_bytes
        )


def _where(message: Message) -> str:
    return letters.place(message.topic() or "", message.partition() or 0, message.offset() or 0)
