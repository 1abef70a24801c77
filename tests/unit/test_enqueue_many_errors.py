"""``enqueue_many`` when something other than a payload fails: the payloads' iterable raising
(a generator over a database cursor), or the producer. The exception keeps its type and tells
which jobs were sent, so that a retry need not send them twice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline import Pipeline, Settings, _enqueuemany
from pipeline._transport import DeliveryCallback
from pipeline.testing import InMemoryTransport

TOPIC = "acme.jobs.default"


class CursorDiedError(RuntimeError):
    """What a database driver raises while its cursor is read."""


def _rows(count: int) -> Iterator[dict[str, Any]]:
    """``count`` payloads, then the cursor fails."""
    for i in range(count):
        yield {"i": i}
    raise CursorDiedError("db cursor died")


def _app(transport: InMemoryTransport) -> Pipeline:
    return Pipeline(Settings(namespace="acme"), transport=transport)


@pytest.mark.parametrize("rows", [0, 1, 3, 5])
def test_an_iterable_that_raises_keeps_its_type_and_carries_the_ids_sent(
    monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    monkeypatch.setattr(_enqueuemany, "BATCH", 2)  # 3 and 5 rows: a batch or two before
    transport = InMemoryTransport()
    app = _app(transport)
    with pytest.raises(CursorDiedError, match="db cursor died") as caught:
        app.enqueue_many("report.build", _rows(rows))
    assert type(caught.value) is CursorDiedError
    sent = transport.jobs(TOPIC)
    assert [json.loads(job.payload)["i"] for job in sent] == list(range(rows))
    assert caught.value.enqueued_ids == [job.id for job in sent]  # type: ignore[attr-defined]
    [note] = caught.value.__notes__
    assert f"enqueue_many sent the {rows} job(s) of the batch before this error" in note
    assert "enqueued_ids" in note
    assert "some may have been" not in note


class _FailsAfter(InMemoryTransport):
    """Takes ``taken`` messages, then its producer fails."""

    def __init__(self, taken: int) -> None:
        super().__init__()
        self.taken = taken

    def produce(
        self, topic: str, value: bytes, key: bytes | None, on_delivery: DeliveryCallback
    ) -> None:
        if len(self.messages) + len(self._pending) >= self.taken:
            raise BufferError("Local: Queue full")
        super().produce(topic, value, key, on_delivery)


@pytest.mark.parametrize("taken", [3, 4], ids=["a-full-batch-taken-in-part", "the-last-batch"])
def test_a_producer_that_raises_counts_the_jobs_it_took_as_sent(
    monkeypatch: pytest.MonkeyPatch, taken: int
) -> None:
    """Five payloads in batches of two: the producer fails in the second (a full batch, of
    which it took one job) or in the third (the last, partial one, sent once the payloads ran
    out). It says how many of the batch it took: those are named as sent, none is unsure, and
    a flush waits for them alone."""
    monkeypatch.setattr(_enqueuemany, "BATCH", 2)
    transport = _FailsAfter(taken)
    app = _app(transport)
    with pytest.raises(BufferError) as caught:
        app.enqueue_many("report.build", [{"i": i} for i in range(5)])
    sent = transport.jobs(TOPIC)
    assert [json.loads(job.payload)["i"] for job in sent] == list(range(taken))
    assert caught.value.enqueued_ids == [job.id for job in sent]  # type: ignore[attr-defined]
    [note] = caught.value.__notes__
    assert f"sent the {taken} job(s) of the batch before this error" in note
    assert "some may have been" not in note
    app.flush(timeout=1)  # the jobs not taken are not waited for


class _BatchFailsAfter(_FailsAfter):
    """Hands a batch over in one call that does not say how many of it it took."""

    def produce_many(
        self, topic: str, values: list[bytes], key: bytes | None, on_delivery: DeliveryCallback
    ) -> None:
        for value in values:
            self.produce(topic, value, key, on_delivery)


def test_a_batch_producer_that_does_not_say_what_it_took_leaves_the_batch_unsure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_enqueuemany, "BATCH", 2)
    transport = _BatchFailsAfter(3)
    with pytest.raises(BufferError) as caught:
        _app(transport).enqueue_many("report.build", [{"i": i} for i in range(5)])
    assert caught.value.enqueued_ids == [job.id for job in transport.jobs(TOPIC)[:2]]  # type: ignore[attr-defined]
    [note] = caught.value.__notes__
    assert "sent the 2 job(s) of the batch before this error" in note
    assert "of the 2 after them, handed to a producer as it raised, some may have been" in note


def test_a_payload_that_fails_validation_is_told_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``PayloadValidationError`` names the payload's index as it did, with no note added."""
    monkeypatch.setattr(_enqueuemany, "BATCH", 2)
    transport = InMemoryTransport()
    app = _app(transport)

    def rows() -> Iterator[Any]:
        yield from ({"i": i} for i in range(3))
        yield ["not", "a", "mapping"]

    with pytest.raises(ValueError, match="job #3 of the batch") as caught:
        app.enqueue_many("report.build", rows())
    assert caught.value.enqueued_ids == [job.id for job in transport.jobs(TOPIC)]  # type: ignore[attr-defined]
    assert not getattr(caught.value, "__notes__", None)
