"""Moves that fit in one Kafka message, so that a failed job near the size limit still moves.

A retry carries the job with its attempt history; a dead letter carries the job, that history
and a traceback. A job enqueued just under the producers' ``message.max.bytes`` grows past it
when it fails, and librdkafka refuses a message over it at once: the transaction of the move
would abort, the worker stop, and the next worker meet the same job, so that its partition
never got past it. A record that does not fit is made smaller instead, keeping what matters
most:

1. the attempt history cut to its last entry, messages cut short, no traceback; then without
   the Kafka headers of the job's message;
2. for a retry that still does not fit: a dead letter (reason ``too_large``), through the steps
   of dead letters;
3. for a dead letter that still does not fit: the letter without the job (or its raw bytes),
   saying how large the job was and where its message stays (its topic, partition and offset,
   until that topic's retention removes it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from pipeline._failures import cut_text

if TYPE_CHECKING:
    from pipeline import Job
    from pipeline._records import DeadLetter

__all__ = ["LEAN_MESSAGE_MAX", "lean_job", "lean_letter", "without_job"]

LEAN_MESSAGE_MAX = 200
"""Characters of an error message kept in a record made smaller."""


def lean_job(job: Job) -> Job:
    """``job`` with its attempt history cut to the last entry, whose message is cut short."""
    if not job.errors:
        return job
    last = job.errors[-1]
    return replace(job, errors=[replace(last, message=cut_text(last.message, LEAN_MESSAGE_MAX))])


def lean_letter(letter: DeadLetter) -> DeadLetter:
    """``letter`` with its job's history cut (:func:`lean_job`), its message cut short and no
    traceback."""
    job = lean_job(letter.job) if letter.job is not None else None
    return replace(
        letter, job=job, message=cut_text(letter.message, LEAN_MESSAGE_MAX), traceback=None
    )


def without_job(letter: DeadLetter, size: int, max_bytes: int) -> DeadLetter:
    """``letter`` without the job or raw bytes it could not carry (``size`` bytes), saying so."""
    where = f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset}"
    note = (
        f"{letter.message} (the job, {size} bytes, is too large for a dead letter under "
        f"message.max.bytes {max_bytes}: its message stays at {where} until that topic's "
        "retention removes it)"
    )
    return replace(letter, job=None, raw_value=None, raw_headers={}, message=note)
