"""The stub worker: delays and retries on the fake clock, order, priorities, fail_fast."""

from __future__ import annotations

import asyncio
import contextvars
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pipeline import Backoff, CallNext, JobCall, JobContext, Pipeline, Retry, Settings
from pipeline.testing import (
    DeadLetterReason,
    FakeClock,
    InMemoryTransport,
    JobStatus,
    StubWorker,
    stub_worker,
)

NO_JITTER = Backoff(base_s=10, factor=2, jitter=0)


class DeclinedError(Exception):
    pass


def make_app() -> Pipeline:
    return Pipeline(Settings(namespace="acme"), transport=InMemoryTransport())


def test_the_app_s_enqueues_run_and_its_own_transport_is_back_after_the_block() -> None:
    app = make_app()
    own = app._transport
    done: list[str] = []

    @app.job("email.send")
    def send_email(to: str) -> str:
        done.append(to)
        return f"sent to {to}"

    with stub_worker(app) as worker:
        assert app._transport is worker.transport
        send_email.enqueue(to="a@b.c")
        app.enqueue("email.send", {"to": "x@y.z"})
        report = worker.drain()
    assert app._transport is own
    assert done == ["a@b.c", "x@y.z"]
    assert [r.value for r in report.succeeded] == ["sent to a@b.c", "sent to x@y.z"]
    assert report.results == report.succeeded
    assert (report.dead, report.retried, worker.pending()) == ([], [], [])


def test_a_delay_is_honoured_on_the_fake_clock() -> None:
    app = make_app()
    clock = FakeClock()
    start = clock.now_ms()
    ran_at: list[int] = []

    @app.job("later")
    async def later(n: int) -> None:
        ran_at.append(clock.now_ms())

    with stub_worker(app, clock=clock) as worker:
        app.enqueue("later", {"n": 2}, delay=30)
        app.enqueue("later", {"n": 1}, delay=timedelta(seconds=5))
        clock.advance(2)  # 3 s of the 5 s delay are left
        report = worker.drain()
    assert [r.job.attempt for r in report.succeeded if r.job] == [1, 1]
    # Never early; late by at most the real time between the stub's last step and the enqueue.
    assert start + 5_000 <= ran_at[0] < start + 6_000
    assert start + 30_000 <= ran_at[1] < start + 31_000
    assert clock.now_ms() == ran_at[1], "the clock went to the last due job, no further"


def test_drain_until_stops_advancing_the_clock_there_and_leaves_later_jobs_pending() -> None:
    app = make_app()
    clock = FakeClock()
    start = clock.now_ms()

    @app.job("later")
    def later(n: int) -> int:
        return n

    with stub_worker(app, clock=clock) as worker:
        app.enqueue("later", {"n": 1}, delay=10)
        app.enqueue("later", {"n": 2}, delay=60)
        first = worker.drain(until_ms=start + 20_000)
        assert [r.value for r in first.results] == [1]
        assert clock.now_ms() == start + 20_000
        [pending] = worker.pending()
        assert pending.type == "later"
        second = worker.drain()
    assert [r.value for r in second.results] == [2]
    assert worker.pending() == []


def test_retries_follow_the_backoff_on_the_clock_until_max_attempts_then_dead() -> None:
    app = make_app()
    clock = FakeClock()
    start = clock.now_ms()
    attempts: list[tuple[int, int, int]] = []

    @app.job("flaky", max_attempts=3, backoff=NO_JITTER)
    def flaky(ctx: JobContext) -> None:
        attempts.append((ctx.attempt, clock.now_ms() - start, len(ctx.job.errors)))
        raise RuntimeError("boom")

    with stub_worker(app, clock=clock) as worker:
        flaky.enqueue()
        report = worker.drain()
    assert attempts == [(1, 0, 0), (2, 10_000, 1), (3, 30_000, 2)]
    assert [r.status for r in report.results] == [JobStatus.RETRY] * 2 + [JobStatus.DEAD]
    assert [r.retry_in_s for r in report.retried] == [10.0, 20.0]
    [dead] = report.dead
    assert (dead.reason, dead.attempt) == (DeadLetterReason.MAX_ATTEMPTS, 3)


def test_a_retry_that_succeeds_ends_succeeded_and_retry_asks_its_own_time() -> None:
    app = make_app()
    clock = FakeClock()
    start = clock.now_ms()

    @app.job("poll")
    def poll(ctx: JobContext) -> int:
        if ctx.attempt < 3:
            raise Retry(after=60)
        return clock.now_ms() - start

    with stub_worker(app, clock=clock) as worker:
        poll.enqueue()
        report = worker.drain()
    [done] = report.succeeded
    assert (done.value, done.attempt) == (120_000, 3)
    assert [r.retry_at_ms for r in report.retried] == [start + 60_000, start + 120_000]


@pytest.mark.parametrize(
    ("raised", "reason"),
    [(DeclinedError("no"), "fatal_error"), (TypeError("in the body"), "max_attempts")],
)
def test_dead_letters_carry_the_worker_s_reasons(raised: Exception, reason: str) -> None:
    app = make_app()

    @app.job("pay", fatal=(DeclinedError,), max_attempts=1)
    def pay(amount: int) -> None:
        raise raised

    with stub_worker(app) as worker:
        pay.enqueue(amount=5)
        app.enqueue("nobody.handles.this", {})
        worker.transport.produce(app.topics.jobs("default"), b"\x00junk", None, _ignore)
        report = worker.drain()
    assert [f"{r.reason}" for r in report.dead] == [reason, "unknown_type", "decode_error"]


def test_one_key_s_jobs_run_in_enqueue_order_and_higher_priorities_first() -> None:
    app = make_app()
    ran: list[str] = []

    @app.job("step")
    def step(name: str) -> None:
        ran.append(name)

    with stub_worker(app) as worker:
        for n in range(4):
            app.enqueue("step", {"name": f"k{n}"}, key="one-key")
        app.enqueue("step", {"name": "low"}, priority="low")
        app.enqueue("step", {"name": "critical"}, priority="critical")
        app.enqueue("step", {"name": "high"}, priority="high")
        worker.drain()
    assert ran == ["critical", "high", "k0", "k1", "k2", "k3", "low"]


def test_jobs_a_handler_enqueues_run_in_the_same_drain() -> None:
    app = make_app()
    ran: list[int] = []

    @app.job("countdown")
    async def countdown(n: int) -> None:
        ran.append(n)
        if n:
            app.enqueue("countdown", {"n": n - 1}, delay=1)

    with stub_worker(app) as worker:
        app.enqueue("countdown", {"n": 3})
        report = worker.drain()
    assert ran == [3, 2, 1, 0]
    assert len(report.succeeded) == 4


def test_drain_stops_after_max_jobs_runs() -> None:
    app = make_app()

    @app.job("forever")
    def forever() -> None:
        app.enqueue("forever", {})

    with stub_worker(app) as worker:
        app.enqueue("forever", {})
        report = worker.drain(max_jobs=5)
        assert len(report.results) == 5
        assert len(worker.pending()) == 1


def test_fail_fast_raises_an_unexpected_error_with_the_job_noted() -> None:
    app = make_app()

    @app.job("boom", max_attempts=5)
    def boom() -> None:
        raise ValueError("unexpected")

    with stub_worker(app, fail_fast=True) as worker:
        job_id = boom.enqueue()
        with pytest.raises(ValueError, match="unexpected") as info:
            worker.drain()
    assert any(job_id in note for note in info.value.__notes__)


def test_fail_fast_still_follows_retry() -> None:
    app = make_app()

    @app.job("later")
    def later(ctx: JobContext) -> int:
        if ctx.attempt == 1:
            raise Retry(after=1)
        return ctx.attempt

    with stub_worker(app, fail_fast=True) as worker:
        later.enqueue()
        report = worker.drain()
    assert [r.value for r in report.succeeded] == [2]


def test_fail_fast_follows_a_retry_raised_in_a_task_group() -> None:
    # The group was raised from drain(), where the worker (and fail_fast=False) retries.
    app = make_app()

    @app.job("fanned")
    async def fanned(ctx: JobContext) -> int:
        if ctx.attempt == 1:
            async with asyncio.TaskGroup() as group:
                group.create_task(_retry_in(1))
        return ctx.attempt

    with stub_worker(app, fail_fast=True) as worker:
        fanned.enqueue()
        report = worker.drain()
    assert [r.value for r in report.succeeded] == [2]


async def _retry_in(seconds: float) -> None:
    raise Retry(after=seconds)


def test_a_stub_worker_cannot_be_started_twice_and_stops_once() -> None:
    app = make_app()
    worker = StubWorker(app)
    worker.start()
    with pytest.raises(Exception, match="started already"):
        worker.start()
    worker.stop()
    worker.stop()
    assert app._transport is not worker.transport


def _ignore(error: object, message: object) -> None:
    return None


def _charging() -> tuple[Pipeline, list[int]]:
    """An application whose ``charge`` jobs hold their idempotency key 60 s, and the ``n`` of
    each charge that ran."""
    app = make_app()
    ran: list[int] = []

    @app.job("charge", dedup_ttl=60)
    def charge(n: int) -> None:
        ran.append(n)

    return app, ran


def test_a_duplicate_idempotency_key_is_acknowledged_without_running_until_its_ttl() -> None:
    app, ran = _charging()
    clock = FakeClock()
    with stub_worker(app, clock=clock) as worker:
        app.enqueue("charge", {"n": 1}, idempotency_key="order-7")
        app.enqueue("charge", {"n": 2}, idempotency_key="order-7")
        app.enqueue("charge", {"n": 3}, idempotency_key="order-8")
        first = worker.drain()
        clock.advance(61)  # the key's hold is over
        app.enqueue("charge", {"n": 4}, idempotency_key="order-7")
        second = worker.drain()
    assert ran == [1, 3, 4]
    assert [job.payload for job in first.deduplicated] == [b'{"n":2}']
    assert second.deduplicated == []


def test_a_key_is_checked_when_its_job_is_written_not_when_the_test_drains() -> None:
    # The worker reads a job (and checks its key) as it is written: a duplicate enqueued while
    # the key is held is not run, however far the test moves the clock before it drains.
    app, ran = _charging()
    clock = FakeClock()
    with stub_worker(app, clock=clock) as worker:
        app.enqueue("charge", {"n": 1}, idempotency_key="order-7")
        worker.drain()
        app.enqueue("charge", {"n": 2}, idempotency_key="order-7")
        clock.advance(120)
        late = worker.drain()
    assert ran == [1]
    assert [job.payload for job in late.deduplicated] == [b'{"n":2}']


@pytest.mark.parametrize(
    "due",
    [{"run_at": datetime.now(UTC) - timedelta(minutes=1)}, {"delay": 0}],
    ids=["run_at-a-minute-ago", "delay-0"],  # the same in every xdist process
)
def test_a_job_due_when_written_keeps_its_place_among_its_key_s_jobs(
    due: dict[str, Any],
) -> None:
    # It went through the waiting list and ran after the job of its key written after it.
    app = make_app()
    ran: list[str] = []

    @app.job("account")
    def account(step: str) -> None:
        ran.append(step)

    with stub_worker(app, clock=FakeClock()) as worker:
        app.enqueue("account", {"step": "open"}, key="acct-1", **due)
        app.enqueue("account", {"step": "close"}, key="acct-1")
        worker.drain()
    assert ran == ["open", "close"]


def test_a_retried_job_keeps_its_own_key_and_a_dead_one_releases_it() -> None:
    app = make_app()
    ran: list[tuple[int, int]] = []

    @app.job("flaky", max_attempts=2, backoff=NO_JITTER)
    def flaky(ctx: JobContext, n: int) -> None:
        ran.append((n, ctx.attempt))
        raise RuntimeError("boom")

    with stub_worker(app) as worker:
        app.enqueue("flaky", {"n": 1}, idempotency_key="k")
        worker.drain()
        app.enqueue("flaky", {"n": 2}, idempotency_key="k")  # the first is dead: the key is free
        report = worker.drain()
    assert ran == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert report.deduplicated == []


def test_async_handlers_share_one_event_loop_as_on_a_worker() -> None:
    app = make_app()
    loops: list[asyncio.AbstractEventLoop] = []

    @app.job("locked")
    async def locked() -> None:
        loops.append(asyncio.get_running_loop())

    with stub_worker(app) as worker:
        for _ in range(3):
            locked.enqueue()
        report = worker.drain()
    assert len(report.succeeded) == 3
    assert loops[0] is loops[1] is loops[2], "a client made in one job works in the next"


REQUEST: contextvars.ContextVar[str] = contextvars.ContextVar("request", default="none")


class TagsTheRequest:
    """Sets :data:`REQUEST` for the job it runs, and never resets it."""

    async def intercept(self, call: JobCall, next: CallNext) -> object:
        seen = REQUEST.get()
        REQUEST.set(call.job.id)
        return seen, await next(call)


@pytest.mark.parametrize("in_async_test", [False, True], ids=["sync-test", "async-test"])
def test_each_job_runs_in_a_copy_of_the_test_s_context_as_on_a_worker(in_async_test: bool) -> None:
    app = Pipeline(
        Settings(namespace="acme"), transport=InMemoryTransport(), middleware=[TagsTheRequest()]
    )

    @app.job("tagged")
    async def tagged() -> str:
        return REQUEST.get()

    def flow() -> list[object]:
        REQUEST.set("test")
        with stub_worker(app) as worker:
            ids = [tagged.enqueue() for _ in range(3)]
            values = [r.value for r in worker.drain().results]
        assert REQUEST.get() == "test", "a job's context variables stay in the job"
        return [*ids, *values]

    async def in_a_test() -> list[object]:
        return flow()

    *ids, first, second, third = asyncio.run(in_a_test()) if in_async_test else flow()
    # Each job sees the test's value, never the one an earlier job set in its own context.
    assert [first, second, third] == [("test", job_id) for job_id in ids]


def test_a_retry_and_a_released_delayed_job_are_read_at_offsets_of_their_own() -> None:
    app = make_app()
    seen: list[tuple[int, str, int]] = []

    @app.job("where", backoff=NO_JITTER)
    def where(ctx: JobContext) -> None:
        seen.append((ctx.attempt, ctx.topic, ctx.offset))
        if ctx.attempt == 1:
            raise RuntimeError("once more")

    with stub_worker(app) as worker:
        app.enqueue("where", {}, key="k")
        app.enqueue("where", {}, key="k", delay=60)  # on the deferred topic until due
        worker.drain()
    # One partition (one key): each message on it, written when it arrived, at the next offset.
    topic = app.topics.jobs("default")
    assert seen == [(1, topic, 0), (2, topic, 1), (1, topic, 2), (2, topic, 3)]


def test_a_delay_counts_from_the_enqueue_however_long_the_enqueue_took() -> None:
    app = make_app()
    clock = FakeClock()
    start = clock.now_ms()
    ran_at: list[int] = []

    @app.job("bulk")
    def bulk(items: list[int]) -> None:
        ran_at.append(clock.now_ms())

    with stub_worker(app, clock=clock) as worker:
        # Validating 50,000 items takes milliseconds after the producer read the clock.
        app.enqueue("bulk", {"items": list(range(50_000))}, delay=1)
        worker.drain()
    [at] = ran_at
    assert start + 1_000 <= at < start + 2_000


def test_a_retry_at_a_wall_clock_time_is_that_far_ahead_on_the_fake_clock() -> None:
    app = make_app()
    clock = FakeClock()
    ran_at: list[int] = []

    @app.job("later_at")
    def later_at(ctx: JobContext) -> None:
        ran_at.append(clock.now_ms())
        if ctx.attempt == 1:
            raise Retry(at=datetime.now(UTC) + timedelta(seconds=60))

    with stub_worker(app, clock=clock) as worker:
        later_at.enqueue()
        worker.drain()
    first, second = ran_at
    assert 60_000 <= second - first < 61_000


@pytest.mark.parametrize("partitions", [3, 6, 12])
def test_a_key_lands_on_the_partition_the_app_s_topics_give_it(partitions: int) -> None:
    from pipeline.testing._partitioner import partition_for

    app = Pipeline(
        Settings(namespace="acme", topics={"partitions": partitions}),
        transport=InMemoryTransport(),
    )
    seen: dict[bytes, int] = {}

    @app.job("keyed")
    def keyed(n: int, ctx: JobContext) -> None:
        assert ctx.key is not None
        seen[bytes(ctx.key)] = ctx.partition

    keys = [f"customer-{i}" for i in range(20)]
    with stub_worker(app) as worker:
        for n, key in enumerate(keys):
            app.enqueue("keyed", {"n": n}, key=key)
        worker.drain()
    assert seen == {key.encode(): partition_for(key.encode(), partitions) for key in keys}
    assert max(seen.values()) < partitions


def test_a_stub_worker_block_can_be_left_inside_an_async_test() -> None:
    app = make_app()
    own = app._transport
    ran: list[int] = []

    @app.job("note")
    async def note(n: int) -> None:
        ran.append(n)

    async def main() -> None:
        with stub_worker(app) as worker:
            app.enqueue("note", {"n": 1})
            worker.drain()

    asyncio.run(main())
    assert ran == [1]
    assert app._transport is own


def test_the_in_memory_transport_lists_jobs_not_acknowledged_yet() -> None:
    transport = InMemoryTransport()
    app = Pipeline(Settings(namespace="acme"), transport=transport)
    app.enqueue("email.send", {"to": "a@b.c"})  # no flush: the producer polls every 1,000
    [job] = transport.jobs(app.topics.jobs("default"))
    assert job.type == "email.send"
