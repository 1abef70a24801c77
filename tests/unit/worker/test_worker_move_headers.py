"""The Kafka headers of a job's message (a W3C ``traceparent`` another producer set, say) go
with the job when the worker moves it: deferred (read long before its ``not_before``),
retried, or dead-lettered (for a replay to send again). Each wrote the job without them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from pipeline import Job, JobCodec, Pipeline
from pipeline._codec import DeadLetterCodec
from pipeline._deadletters._outgoing import replay_message
from pipeline._job import now_ms
from pipeline._messagesize import RECORD_OVERHEAD
from pipeline._registry import JobType
from pipeline.testing import InMemoryTransport
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker.route.outcome import OutcomeKind
from pipeline_worker.route.policy import Failure, FailurePolicy, Record
from pipeline_worker.route.router import FailureRouter

from .support import Harness

HEADERS: list[tuple[str, str | bytes | None]] = [
    ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
]


class Moves:
    """A mover that writes every move at once and keeps its records."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.changed = asyncio.Event()

    def submit(
        self,
        where: tuple[str, int],
        offset: int,
        records: Sequence[Record],
        done: Callable[[bool], None],
        **_: Any,
    ) -> None:
        self.records.extend(records)
        self.changed.set()
        done(True)


@pytest.mark.parametrize("move", ["deferred", "retried", "dead"])
def test_a_moved_job_keeps_its_message_s_headers(move: str) -> None:
    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport())

        @app.job("fails", max_attempts=1 if move == "dead" else None)
        def fails() -> None:
            raise RuntimeError("downstream down")

        policy = FailurePolicy("acme", [5.0], codec=app.codec, worker="w", events=False)
        moves = Moves()
        h = Harness(app, router=FailureRouter(policy, moves, WorkerMetrics()))  # type: ignore[arg-type]
        later = now_ms() + 3_600_000 if move == "deferred" else None
        h.feed(h.message("fails", key=b"k", not_before=later, headers=HEADERS))
        await asyncio.wait_for(moves.changed.wait(), 5)
        [record] = moves.records
        if move == "dead":  # in the letter, which `pipeline dlq replay` sends them from
            assert record.topic == "acme.dlq"
            assert record.value is not None
            letter = DeadLetterCodec().decode(record.value)
            assert letter.job is not None
            assert letter.raw_headers == {"traceparent": HEADERS[0][1]}
            assert replay_message(letter, "acme").headers == [("traceparent", HEADERS[0][1])]
        else:
            assert record.topic == ("acme.deferred" if move == "deferred" else "acme.retry.0")
            assert (record.key, record.headers) == (b"k", HEADERS)
        assert await h.processor.wait_idle([h.partition], 5.0)
        await h.processor.close()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_deferral_too_large_with_its_headers_goes_without_them() -> None:
    job = Job(id="j", type="t", payload=b"x" * 900, not_before=now_ms() + 3_600_000)
    value = JobCodec().encode(job)
    room = len(value) + len(b"k") + RECORD_OVERHEAD + 100  # headers of 100 bytes at most
    policy = FailurePolicy(
        "acme", [5.0], codec=JobCodec(), worker="w", events=False, max_bytes=room
    )
    [fits] = policy.defer(job, b"k", [("h", b"v" * 99)]).records
    [too_large] = policy.defer(job, b"k", [("h", b"v" * 100)]).records
    assert (fits.value, fits.headers) == (value, [("h", b"v" * 99)])
    assert (too_large.value, too_large.headers) == (value, None)


def test_headers_give_way_to_the_job_in_a_retry_or_a_dead_letter_near_the_size_limit() -> None:
    """Carried since jobs keep their message's headers, they were counted and never dropped: a
    job whose retry fitted without them was dead-lettered ``too_large``, and its dead letter
    lost the job where, without them, it kept it."""
    limit = 20_000
    headers: list[tuple[str, str | bytes | None]] = [("baggage", b"x" * 2_000)]
    policy = FailurePolicy("acme", [5.0], codec=JobCodec(), worker="w", events=False,
                           max_bytes=limit)  # fmt: skip

    def decided(payload: int, attempt: int, with_headers: bool) -> Any:
        job = Job(id="j", type="t", payload=b'"' + b"p" * payload + b'"', attempt=attempt,
                  max_attempts=5)  # fmt: skip
        failure = Failure(OutcomeKind.FAILED, "acme.jobs.default", 0, 7, b"k", job,
                          JobType("t", lambda: None), RuntimeError("boom"),
                          raw_headers=headers if with_headers else None)  # fmt: skip
        return policy.decide(failure, now_ms())

    headers_dropped = 0
    for payload in range(limit - 3_500, limit - 2_000, 10):
        plain, carried = decided(payload, 1, False), decided(payload, 1, True)
        assert carried.dead == plain.dead, payload  # retried whenever the job alone fits
        if not carried.dead and carried.records[0].headers is None:
            headers_dropped += 1
        last = [decided(payload, 5, h).records[0].value for h in (False, True)]
        plain_letter, carried_letter = (DeadLetterCodec().decode(v) for v in last)
        assert (carried_letter.job is None) == (plain_letter.job is None), payload
    assert headers_dropped  # the sizes swept reach the case
