"""What a job's handler sees and how the job ends: the same assertions on the stub and on Kafka."""

from __future__ import annotations

import itertools
import random
from typing import TYPE_CHECKING

import pytest

from pipeline import PayloadValidationError

from .app import TIME_LIMIT_S
from .harness import Outcome

if TYPE_CHECKING:
    from .harness import Call, Harness

LATE_MS = 10_000
"""How late a real worker may start a job after its due time here: a retry tier's or the
scheduler's round trip on a busy machine (the stub is exact)."""


def _attempts(calls: list[Call]) -> list[tuple[int, str | None]]:
    return [(call.attempt, call.ended) for call in calls]


def _gaps_ms(calls: list[Call]) -> list[int]:
    """From each call's start to the next call's start."""
    return [later.at_ms - earlier.at_ms for earlier, later in itertools.pairwise(calls)]


def test_a_job_succeeds_with_what_its_handler_returned(harness: Harness) -> None:
    job = harness.enqueue("echo", {"text": "hello"})
    settled = harness.settle([job])
    assert settled[job] == Outcome("succeeded", None, 1, {"echo": "hello", "attempt": 1})
    assert _attempts(settled.calls_of(job)) == [(1, "return")]


@pytest.mark.parametrize("after_s", [1.0, 4.5], ids=["retry-tier", "deferred"])
def test_a_retry_runs_the_job_again_no_sooner_than_asked(harness: Harness, after_s: float) -> None:
    # 4.5 s fits no retry tier of the real worker (0.5 s and 2 s): it goes through the scheduler.
    job = harness.enqueue("later", {"after_s": after_s})
    settled = harness.settle([job])
    assert settled[job] == Outcome("succeeded", None, 2, "done at attempt 2")
    calls = settled.calls_of(job)
    assert _attempts(calls) == [(1, "raise"), (2, "return")]
    assert after_s * 1000 <= _gaps_ms(calls)[0] < after_s * 1000 + LATE_MS


def test_a_retry_at_a_time_runs_the_job_again_at_that_time(harness: Harness) -> None:
    job = harness.enqueue("later_at", {"after_s": 1.0})
    settled = harness.settle([job])
    assert settled[job] == Outcome("succeeded", None, 2, "done at attempt 2")
    calls = settled.calls_of(job)
    assert _attempts(calls) == [(1, "raise"), (2, "return")]
    assert 1000 <= _gaps_ms(calls)[0] < 1000 + LATE_MS


def test_a_retry_on_the_last_attempt_dead_letters_the_job(harness: Harness) -> None:
    job = harness.enqueue("later", {"after_s": 1.0}, max_attempts=1)
    settled = harness.settle([job])
    assert settled[job] == Outcome("dead", "max_attempts", 1)
    assert _attempts(settled.calls_of(job)) == [(1, "raise")]


def test_a_transient_error_is_retried_with_backoff_until_max_attempts(harness: Harness) -> None:
    job = harness.enqueue("flaky", {"n": 1})
    fewer = harness.enqueue("flaky", {"n": 2}, max_attempts=2, priority="high")
    more = harness.enqueue("flaky", {"n": 3}, max_attempts=5)
    settled = harness.settle([job, fewer, more])
    assert settled[job] == Outcome("dead", "max_attempts", 3)
    calls = settled.calls_of(job)
    assert _attempts(calls) == [(1, "raise"), (2, "raise"), (3, "raise")]
    assert [(c.priority, c.max_attempts) for c in calls] == [("default", 3)] * 3
    first, second = _gaps_ms(calls)
    assert first >= 500  # the type's backoff: 0.5 s, then 1 s
    assert second >= 1000
    # Asked for fewer runs than the type allows, or more: the smaller limit holds.
    assert settled[fewer] == Outcome("dead", "max_attempts", 2)
    fewer_calls = settled.calls_of(fewer)
    assert _attempts(fewer_calls) == [(1, "raise"), (2, "raise")]
    assert [(c.priority, c.max_attempts) for c in fewer_calls] == [("high", 2)] * 2  # kept
    assert settled[more] == Outcome("dead", "max_attempts", 3)
    assert _attempts(settled.calls_of(more)) == [(1, "raise"), (2, "raise"), (3, "raise")]


def test_the_types_max_attempts_holds_for_a_producer_that_does_not_know_it(
    harness: Harness,
) -> None:
    job = harness.enqueue("flaky", {"n": 1}, foreign=True)  # the envelope says 5, the type 3
    settled = harness.settle([job])
    assert settled[job] == Outcome("dead", "max_attempts", 3)
    assert _attempts(settled.calls_of(job)) == [(1, "raise"), (2, "raise"), (3, "raise")]
    told = [(call.max_attempts, call.last) for call in settled.calls_of(job)]
    assert told == [(3, False), (3, False), (3, True)], "what ctx told the handler"


def test_a_job_a_handler_enqueues_runs_as_a_job_of_its_own(harness: Harness) -> None:
    parent = harness.enqueue("chain", {"text": "from a handler"})
    child = harness.settle([parent])[parent].value
    assert isinstance(child, str)
    settled = harness.settle([child])
    assert settled[child] == Outcome("succeeded", None, 1, {"echo": "from a handler", "attempt": 1})
    assert _attempts(settled.calls_of(child)) == [(1, "return")]


def test_a_fatal_error_dead_letters_the_job_at_once(harness: Harness) -> None:
    job = harness.enqueue("doomed", {"n": 1})
    settled = harness.settle([job])
    assert settled[job] == Outcome("dead", "fatal_error", 1)
    assert _attempts(settled.calls_of(job)) == [(1, "raise")]


def test_a_job_of_an_unknown_type_is_dead_lettered_unrun(harness: Harness) -> None:
    job = harness.enqueue("nobody.handles.this", {"n": 1})
    settled = harness.settle([job])
    assert settled[job] == Outcome("dead", "unknown_type", 1)
    assert settled.calls == []


def test_a_message_that_is_not_a_job_is_dead_lettered_and_the_next_job_runs(
    harness: Harness,
) -> None:
    garbage = harness.send_raw(b"not a job at all")
    job = harness.enqueue("echo", {"text": "after"})
    settled = harness.settle([garbage, job])
    assert settled[garbage] == Outcome("dead", "decode_error", 0)
    assert settled[job] == Outcome("succeeded", None, 1, {"echo": "after", "attempt": 1})
    assert [call.job_id for call in settled.calls] == [job]


def test_a_payload_that_does_not_fit_the_handler_is_dead_lettered_unrun(
    harness: Harness,
) -> None:
    with pytest.raises(PayloadValidationError):
        harness.enqueue("typed", {"count": "three"})  # the app's own enqueue refuses it
    job = harness.enqueue("typed", {"count": "three"}, foreign=True)
    wrong_field = harness.enqueue("typed", {"amount": 3}, foreign=True)
    good = harness.enqueue("typed", {"count": 3}, foreign=True)
    settled = harness.settle([job, wrong_field, good])
    assert settled[job] == Outcome("dead", "validation_error", 1)
    assert settled[wrong_field] == Outcome("dead", "validation_error", 1)
    assert settled[good] == Outcome("succeeded", None, 1, 3)
    assert [call.job_id for call in settled.calls] == [good]


@pytest.mark.parametrize("job_type", ["slow", "slow_sync"], ids=["async", "thread"])
def test_a_job_past_its_time_limit_is_retried_then_dead_lettered_as_timeout(
    harness: Harness, job_type: str
) -> None:
    job = harness.enqueue(job_type, {"seconds": 1.5})
    settled = harness.settle([job])
    assert settled[job] == Outcome("dead", "timeout", 2)
    calls = settled.calls_of(job)
    assert _attempts(calls) == [(1, "raise"), (2, "raise")]
    assert _gaps_ms(calls)[0] >= 500  # the type's backoff
    # Stopped at its limit, well before the 1.5 s it asked for. Wall time: the time limit is
    # real time on both sides (the stub's fake clock stands still while a handler runs). The
    # limit starts a little before the observer sees the call, hence the slack below it.
    durations = [c.wall_duration_ms or 0 for c in calls]
    assert all(TIME_LIMIT_S * 1000 - 50 <= ms < 1200 for ms in durations), durations


def test_each_job_runs_in_a_contextvars_context_of_its_own(harness: Harness) -> None:
    # What one job (its handler, an interceptor) sets in a context variable, the next job does
    # not see: each runs in its own copy of the context, as an asyncio Task does.
    first = harness.enqueue("remember", {"n": 1})
    second = harness.enqueue("remember", {"n": 2})
    settled = harness.settle([first, second])
    assert settled[first] == Outcome("succeeded", None, 1, None)
    assert settled[second] == Outcome("succeeded", None, 1, None)


def test_a_job_s_context_locates_the_message_each_attempt_was_read_from(
    harness: Harness,
) -> None:
    # A retry and a delayed job are read from their priority's topic, as messages of their own.
    plain = harness.enqueue("located", {"retries": 0})
    retried = harness.enqueue("located", {"retries": 1})
    delayed = harness.enqueue("located", {"retries": 0}, delay_s=1.0)
    settled = harness.settle([plain, retried, delayed])
    for job, attempts in ((plain, 1), (retried, 2), (delayed, 1)):
        outcome = settled[job]
        assert (outcome.status, outcome.attempts) == ("succeeded", attempts)
        assert outcome.value["own_topic"], outcome
        assert outcome.value["offset"] >= 0, outcome


def test_a_delayed_job_runs_after_its_delay_not_before(harness: Harness) -> None:
    enqueued_at = harness.now_ms()
    late = harness.enqueue("echo", {"text": "late"}, delay_s=2.0)
    soon = harness.enqueue("echo", {"text": "soon"})
    settled = harness.settle([late, soon])
    assert settled[late] == Outcome("succeeded", None, 1, {"echo": "late", "attempt": 1})
    assert settled[soon] == Outcome("succeeded", None, 1, {"echo": "soon", "attempt": 1})
    assert settled.order([late, soon]) == [soon, late]
    [call] = settled.calls_of(late)
    assert enqueued_at + 2000 <= call.at_ms < enqueued_at + 2000 + LATE_MS


def test_a_delayed_job_runs_after_its_delay_however_long_its_enqueue_took(
    harness: Harness,
) -> None:
    # The producer reads the clock for the due time before it validates and encodes the
    # payload, which takes milliseconds for 20,000 items: the delay counts from that reading.
    enqueued_at = harness.now_ms()
    job = harness.enqueue("bulk", {"items": list(range(20_000))}, delay_s=1.0)
    settled = harness.settle([job])
    assert settled[job] == Outcome("succeeded", None, 1, 20_000)
    [call] = settled.calls_of(job)
    assert call.at_ms >= enqueued_at + 1000, f"ran {enqueued_at + 1000 - call.at_ms} ms early"


KAFKA_PARTITIONS = {
    "customer-0": 1,
    "customer-1": 0,
    "customer-2": 2,
    "customer-3": 1,
    "customer-4": 1,
    "customer-5": 0,
    "customer-6": 1,
    "customer-7": 1,
    "customer-8": 2,
    "customer-9": 2,
    "customer-10": 0,
    "customer-11": 2,
}
"""Where a real Kafka producer puts jobs of these keys among 3 partitions (murmur2, as seen)."""


def test_a_keyed_job_runs_from_the_partition_kafka_gives_its_key(harness: Harness) -> None:
    jobs = {harness.enqueue("echo", {"text": key}, key=key): key for key in KAFKA_PARTITIONS}
    settled = harness.settle(list(jobs))
    assert {jobs[call.job_id]: call.partition for call in settled.calls} == KAFKA_PARTITIONS


def test_jobs_of_one_key_run_one_at_a_time_in_enqueue_order(harness: Harness) -> None:
    rng = random.Random(12)
    keys: dict[str, list[str]] = {"left": [], "right": []}
    for n in range(16):
        key = rng.choice(sorted(keys))
        pause_ms = rng.uniform(0, 30)
        keys[key].append(harness.enqueue("ordered", {"n": n, "pause_ms": pause_ms}, key=key))
    settled = harness.settle([job for jobs in keys.values() for job in jobs])
    for key, jobs in keys.items():
        assert settled.order(jobs) == jobs, f"key {key}: jobs ran out of enqueue order"
        calls = [call for call in settled.calls if call.key == key and call.job_id in jobs]
        overlapping = [
            (earlier.job_id, later.job_id)
            for earlier, later in itertools.pairwise(calls)
            if earlier.ended_at_ms is None or later.at_ms < earlier.ended_at_ms
        ]
        assert overlapping == [], f"key {key}: a job started before the one before it ended"
    assert all(outcome.status == "succeeded" for outcome in settled.outcomes.values())


def test_a_higher_prioritys_backlog_runs_before_a_lower_ones(harness: Harness) -> None:
    with harness.backlog():
        low = [harness.enqueue("echo", {"text": f"low {n}"}, priority="low") for n in range(6)]
        high = [harness.enqueue("echo", {"text": f"high {n}"}, priority="high") for n in range(6)]
    settled = harness.settle(low + high)
    assert all(outcome.status == "succeeded" for outcome in settled.outcomes.values())
    order = settled.order(low + high)
    assert set(order[: len(high)]) == set(high), "a low job ran while high ones waited"


# The real worker serves every scenario of the module from one namespace, whose keys it keeps:
# each scenario uses idempotency keys of its own.
def test_a_job_whose_idempotency_key_is_held_is_acknowledged_unrun(harness: Harness) -> None:
    first = harness.enqueue("echo", {"text": "first"}, idempotency_key="order-1")
    again = harness.enqueue("echo", {"text": "again"}, idempotency_key="order-1")
    other = harness.enqueue("echo", {"text": "other"}, idempotency_key="order-2")
    # The scope of a key is the namespace: the same key at another priority is the same key.
    high = harness.enqueue("echo", {"text": "high"}, idempotency_key="order-1", priority="high")
    settled = harness.settle([first, again, other, high])
    # Of the two copies read first, at default and at high, whichever the worker reads first
    # runs; the copy enqueued after both is deduplicated either way.
    [ran] = [job for job in (first, high) if settled[job].status == "succeeded"]
    assert {settled[job].status for job in (first, high)} == {"succeeded", "deduplicated"}
    assert settled[again].status == "deduplicated"
    assert settled[other] == Outcome("succeeded", None, 1, {"echo": "other", "attempt": 1})
    assert sorted(call.job_id for call in settled.calls) == sorted([ran, other])
    # Held for the type's dedup_ttl after its job succeeded.
    after = harness.enqueue("echo", {"text": "after"}, idempotency_key="order-1")
    assert harness.settle([after])[after].status == "deduplicated"


def test_an_idempotency_key_is_free_again_once_its_job_is_dead_lettered(harness: Harness) -> None:
    doomed = harness.enqueue("doomed", {"n": 1}, idempotency_key="charge-1")
    assert harness.settle([doomed])[doomed] == Outcome("dead", "fatal_error", 1)
    again = harness.enqueue("echo", {"text": "again"}, idempotency_key="charge-1")
    settled = harness.settle([again])
    assert settled[again] == Outcome("succeeded", None, 1, {"echo": "again", "attempt": 1})
    assert _attempts(settled.calls_of(again)) == [(1, "return")]
