"""Messages that are not runnable jobs, written by an independent client, end in the DLQ.

kcat writes 1,000 random byte strings, truncated jobs, jobs with a fingerprint no schema has and
jobs of a type no handler is registered for, between valid jobs. The worker must dead-letter
every one of them with a reason (the raw bytes kept when they do not decode), run every valid
job, keep running, and commit every partition to its end.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import uuid
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from pipeline import Job, Priority
from pipeline._deadletters import read_dead_letters
from pipeline._records import DeadLetterReason

from .harness import check_ran, enqueue

if TYPE_CHECKING:
    from pathlib import Path

    from pipeline import Pipeline

    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka

RANDOM_STRINGS = 1000
PARTITIONS = 6


def _bad_values(producer: Pipeline, rng: random.Random) -> list[tuple[bytes, str]]:
    """(value, expected dead-letter reason) for each bad message."""
    values: list[tuple[bytes, str]] = []
    for _ in range(RANDOM_STRINGS):
        values.append((rng.randbytes(rng.randint(1, 300)), DeadLetterReason.DECODE_ERROR))
    for i in range(50):
        job = Job(id=uuid.uuid4().hex, type="noop", payload=b'{"n": -1}')
        valid = producer.codec.encode(job)
        values.append((valid[: rng.randint(1, len(valid) - 1)], DeadLetterReason.DECODE_ERROR))
        wrong_fingerprint = b"\xc3\x01" + rng.randbytes(8) + valid[10:]
        values.append((wrong_fingerprint, DeadLetterReason.DECODE_ERROR))
        unknown = Job(id=uuid.uuid4().hex, type=f"no.such.type{i}", payload=b"{}")
        values.append((producer.codec.encode(unknown), DeadLetterReason.UNKNOWN_TYPE))
    return values


def _kcat_produce(servers: str, topic: str, partition: int, files: list[Path]) -> None:
    """kcat -P with file arguments writes each file as one message, byte for byte."""
    kcat = shutil.which("kcat")
    assert kcat is not None, "kcat is not installed (.ci/run installs it)"
    result = subprocess.run(
        [kcat, "-P", "-b", servers, "-t", topic, "-p", str(partition), *map(str, files)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")


def test_garbage_from_kcat_is_dead_lettered_and_the_partitions_reach_their_ends(
    kit: WorkerKit, tmp_path: Path
) -> None:
    topic = kit.topics.jobs(Priority.DEFAULT)
    rng = random.Random(7)
    bad = _bad_values(kit.producer, rng)
    expected = Counter(value for value, _ in bad)
    reasons = {value: reason for value, reason in bad}
    ids = enqueue(kit.producer, "noop", 300)
    chunks: list[list[Path]] = [[] for _ in range(PARTITIONS)]
    for i, (value, _) in enumerate(bad):
        path = tmp_path / f"bad-{i}.bin"
        path.write_bytes(value)
        chunks[i % PARTITIONS].append(path)
    for partition, files in enumerate(chunks):
        _kcat_produce(kit.settings.bootstrap_servers, topic, partition, files)
    ids += enqueue(kit.producer, "noop", 300, first=300)

    worker = kit.workers.start("--concurrency", "20", "--burst")
    assert worker.wait(timeout=180) == 0, worker.log_tail()

    assert check_ran(kit.recording, ids, exactly_once=True) == []
    assert kit.offsets.lag([topic]) == {}, "the commits stopped short of the partitions' ends"
    letters = [stored.letter for stored in read_dead_letters(kit.settings).letters]
    found: Counter[bytes] = Counter()
    for letter in letters:
        if letter.job is not None:
            value = kit.producer.codec.encode(letter.job)
        else:
            assert letter.raw_value is not None
            value = letter.raw_value
        found[value] += 1
        assert letter.reason == reasons.get(value), (letter.reason, letter.message)
        assert letter.source_topic == topic
        assert letter.message, "a dead letter says why"
    assert found == expected, "every bad message is dead-lettered exactly once"
