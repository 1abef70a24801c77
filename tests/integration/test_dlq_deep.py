"""``read_dead_letters`` (every ``pipeline dlq`` command) over many large dead letters."""

from __future__ import annotations

import os
import tracemalloc
from typing import TYPE_CHECKING

from pipeline._deadletters import read_dead_letters
from pipeline._job import Job, PayloadEncoding, now_ms
from pipeline._records import DeadLetter

from .test_dlq_cli import topics, write_letters

if TYPE_CHECKING:
    from pipeline._settings import Settings

__all__ = ["topics"]  # the fixture, used by name

LETTERS = 2000
PAYLOAD_BYTES = 24_000


def big_letter(n: int) -> DeadLetter:
    job = Job(
        id=f"big-{n}",
        type="report.build",
        payload=os.urandom(PAYLOAD_BYTES),
        payload_encoding=PayloadEncoding.AVRO,
        attempt=5,
        max_attempts=5,
    )
    return DeadLetter(
        reason="max_attempts",
        message="too slow",
        source_topic="jobs",
        source_partition=0,
        source_offset=n,
        job=job,
        dead_at=now_ms() - 60_000,
    )


def test_reading_holds_each_dead_letter_once_not_also_its_record(topics: Settings) -> None:
    """The reader kept every record of the topic until the end of the read, and decoded them
    only then: each dead letter was in memory twice, as its record's bytes and decoded."""
    write_letters(topics, [big_letter(n) for n in range(LETTERS)])
    tracemalloc.start()
    try:
        snapshot = read_dead_letters(topics, timeout=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(snapshot.letters) == LETTERS
    assert snapshot.undecodable == 1  # write_letters adds a record that is not a dead letter
    payloads = LETTERS * PAYLOAD_BYTES
    # The letters themselves, plus one batch of records (at most 500) read but not yet let go.
    assert peak < 1.5 * payloads, f"peak {peak / 1e6:.1f} MB for {payloads / 1e6:.1f} MB"
