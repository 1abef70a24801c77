"""A payload that does not fit the handler's annotations is dead-lettered, not run.

The recording app's ``noop`` handler takes ``n: int``. A producer that knows no handler (any
client in any language could be it) writes a job with ``n`` a string: the worker must not call
the handler with it, but dead-letter it as ``validation_error`` with the field's error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pipeline._deadletters import read_dead_letters
from pipeline._records import DeadLetterReason

from .harness import check_ran, enqueue

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka


def test_a_payload_of_the_wrong_type_is_dead_lettered_with_its_field_errors(
    kit: WorkerKit,
) -> None:
    ids = enqueue(kit.producer, "noop", 3)
    bad = kit.producer.enqueue("noop", {"n": "not-an-int"})
    kit.producer.flush(60)

    worker = kit.workers.start("--burst")
    assert worker.wait(timeout=120) == 0, worker.log_tail()

    assert check_ran(kit.recording, ids, exactly_once=True) == []
    letters = [stored.letter for stored in read_dead_letters(kit.settings).letters]
    assert [(letter.job.id if letter.job else None, letter.reason) for letter in letters] == [
        (bad, DeadLetterReason.VALIDATION_ERROR)
    ]
    assert "n: Input should be a valid integer (got 'not-an-int')" in letters[0].message
