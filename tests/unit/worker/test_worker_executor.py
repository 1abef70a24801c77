"""Running handlers: eager coroutines on runner tasks, threads, time limits, outcomes."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from pipeline import AvroPayload, CallNext, Job, JobCall, PayloadValidationError, Pipeline
from pipeline._context import JobContext
from pipeline._job import PayloadEncoding
from pipeline.testing import InMemoryTransport
from pipeline_worker import Middleware, Outcome, OutcomeKind, TimeLimitError
from pipeline_worker.execute.runners import ThreadPool

from .support import Harness, Jobs, state

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


def make_app() -> Pipeline:
    return Pipeline(transport=InMemoryTransport())


def test_coroutines_that_never_suspend_finish_eagerly_inside_a_task() -> None:
    seen: list[tuple[int, bool, str]] = []

    async def main() -> None:
        app = make_app()

        @app.job("quick")
        async def quick(i: int) -> None:
            seen.append((i, asyncio.current_task() is not None, VAR.get()))
            VAR.set(f"leaked by {i}")  # each job has its own context: nothing leaks

        h = Harness(app)
        h.feed(*(h.message("quick", {"i": i}) for i in range(50)))
        await h.recorder.wait_for(50)
        assert h.recorder.kinds() == [OutcomeKind.SUCCEEDED] * 50
        assert h.partition.commit_offset == 50
        assert h.processor.in_flight == 0
        assert h.processor.finished == 50

    run(main)
    assert seen == [(i, True, "unset") for i in range(50)]


def test_a_suspended_job_keeps_its_runner_and_others_run_meanwhile() -> None:
    async def main() -> None:
        app = make_app()
        release = asyncio.Event()

        @app.job("wait")
        async def wait() -> None:
            await release.wait()

        @app.job("quick")
        async def quick() -> None:
            await asyncio.sleep(0)

        h = Harness(app)
        h.feed(h.message("wait"), *(h.message("quick") for _ in range(5)))
        outcomes = await h.recorder.wait_for(5)
        assert {o.offset for o in outcomes} == {1, 2, 3, 4, 5}
        assert h.partition.commit_offset == 0  # offset 0 is still running
        release.set()
        await h.recorder.wait_for(6)
        assert h.partition.commit_offset == 6

    run(main)


def test_exceptions_before_and_after_suspending_fail_the_job() -> None:
    async def main() -> None:
        app = make_app()

        @app.job("early")
        async def early() -> None:
            raise KeyError("early")

        @app.job("late")
        async def late() -> None:
            await asyncio.sleep(0)
            raise ValueError("late")

        @app.job("fine")
        async def fine() -> None:
            return None

        h = Harness(app)
        h.feed(h.message("early"), h.message("late"), h.message("fine"))
        outcomes = await h.recorder.wait_for(3)
        by_offset = {o.offset: o for o in outcomes}
        assert by_offset[0].kind is OutcomeKind.FAILED
        assert isinstance(by_offset[0].error, KeyError)
        assert by_offset[1].kind is OutcomeKind.FAILED
        assert isinstance(by_offset[1].error, ValueError)
        assert by_offset[2].kind is OutcomeKind.SUCCEEDED
        assert h.partition.commit_offset == 3  # failures move the offset on too (for now)
        stats = h.metrics.stats["early", "default"]
        assert (stats.started, stats.failed, stats.succeeded) == (1, 1, 0)

    run(main)


def test_asyncio_timeout_works_inside_a_handler() -> None:
    async def main() -> None:
        app = make_app()

        @app.job("bounded")
        async def bounded() -> None:
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()

        h = Harness(app)
        h.feed(h.message("bounded"))
        [outcome] = await h.recorder.wait_for(1)
        assert outcome.kind is OutcomeKind.FAILED
        assert isinstance(outcome.error, TimeoutError)

    run(main)


def test_a_time_limit_cancels_a_coroutine_and_the_runner_carries_on() -> None:
    cancelled = []

    async def main() -> None:
        app = make_app()

        @app.job("slow", time_limit=0.05)
        async def slow() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        @app.job("after")
        async def after() -> None:
            await asyncio.sleep(0)

        h = Harness(app, concurrency=1)
        h.feed(h.message("slow"), h.message("after"))
        outcomes = await h.recorder.wait_for(2)
        assert [o.kind for o in outcomes] == [OutcomeKind.TIMED_OUT, OutcomeKind.SUCCEEDED]
        assert isinstance(outcomes[0].error, TimeLimitError)
        assert outcomes[0].duration >= 0.05
        assert h.partition.commit_offset == 2
        assert h.metrics.stats["slow", "default"].timed_out == 1

    run(main)
    assert cancelled == [True]


def test_a_time_limit_fails_a_thread_job_at_the_deadline_and_ignores_its_late_result() -> None:
    release = threading.Event()
    returned = threading.Event()

    async def main() -> None:
        app = make_app()

        @app.job("stuck", time_limit=0.05)
        def stuck() -> str:
            release.wait(10)
            returned.set()
            return "late"

        h = Harness(app)
        h.feed(h.message("stuck"))
        [outcome] = await h.recorder.wait_for(1)
        assert outcome.kind is OutcomeKind.TIMED_OUT
        assert not returned.is_set()
        assert h.partition.commit_offset == 1
        assert h.processor.in_flight == 0
        release.set()
        await asyncio.to_thread(returned.wait, 5)
        h.feed(h.message("stuck"))  # the late result must not count as a second outcome
        await h.recorder.wait_for(2)
        assert len(h.recorder.outcomes) == 2

    run(main)


def test_plain_functions_run_on_pool_threads_with_their_own_context() -> None:
    seen: list[tuple[bool, str]] = []

    async def main() -> None:
        app = make_app()
        main_thread = threading.get_ident()

        @app.job("sync")
        def sync(i: int) -> None:
            seen.append((threading.get_ident() != main_thread, VAR.get()))
            VAR.set("leak")

        h = Harness(app, threads=2)
        h.feed(*(h.message("sync", {"i": i}) for i in range(20)))
        await h.recorder.wait_for(20)
        assert h.partition.commit_offset == 20

    run(main)
    assert seen == [(True, "unset")] * 20


def test_the_thread_pool_grows_while_every_thread_blocks_up_to_its_size() -> None:
    lock = threading.Lock()
    release = threading.Event()
    full = threading.Event()
    running = peak = 0

    async def main() -> None:
        app = make_app()

        @app.job("blocking")
        def blocking() -> None:
            nonlocal running, peak
            with lock:
                running += 1
                peak = max(peak, running)
                if running == 4:
                    full.set()
            release.wait(10)
            with lock:
                running -= 1

        h = Harness(app, concurrency=8, threads=4)
        h.feed(*(h.message("blocking") for _ in range(8)))
        assert await asyncio.to_thread(full.wait, 10), f"only {running} ran at once"
        release.set()
        await h.recorder.wait_for(8)
        assert (peak, h.processor.pool.threads) == (4, 4)

    run(main)


class ManualTimers:
    """The two loop calls the thread pool makes, with its growth checks fired by hand."""

    def __init__(self) -> None:
        self.due: list[tuple[Callable[..., None], tuple[Any, ...]]] = []

    def call_later(self, _delay: float, callback: Callable[..., None], *args: Any) -> Any:
        self.due.append((callback, args))
        return self  # the pool only cancels a pending check when it closes

    def cancel(self) -> None:
        self.due.clear()

    def call_soon_threadsafe(self, _callback: Callable[..., None], *_args: Any) -> None:
        return None  # completions are not looked at here

    def fire(self) -> None:
        due, self.due = self.due, []
        for callback, args in due:
            callback(*args)


def test_the_pool_grows_when_a_job_waits_a_whole_check_while_its_thread_keeps_working() -> None:
    # Jobs shorter than a check still wait behind each other: the thread making progress must
    # not hide them. Each job blocks until the test releases it.
    started = [threading.Event() for _ in range(4)]
    release = [threading.Event() for _ in range(4)]
    order = iter(range(4))

    def job() -> None:
        i = next(order)
        started[i].set()
        release[i].wait(10)

    timers = ManualTimers()
    pool = ThreadPool(timers, 4, lambda _batch: None, contextvars.copy_context())  # type: ignore[arg-type]
    jobs, partition = Jobs(), state()
    try:
        pool.submit(jobs.work(partition, handler=job))  # A: the first thread takes it
        assert started[0].wait(10)
        for _ in range(3):  # B (arms a check), C, D
            pool.submit(jobs.work(partition, handler=job))
        release[0].set()
        assert started[1].wait(10)  # the thread took B
        timers.fire()  # every job queued before the check was taken: no growth
        assert pool.threads == 1
        release[1].set()
        assert started[2].wait(10)  # the thread took C, but D waited through the whole check
        timers.fire()
        assert pool.threads == 2
        assert started[3].wait(10), "the new thread did not take D"
    finally:
        for event in release:
            event.set()
        pool.close()


def test_short_jobs_are_run_by_a_few_threads() -> None:
    async def main() -> None:
        app = make_app()

        @app.job("short")
        def short(i: int) -> int:
            return i * 2

        h = Harness(app, concurrency=64)
        h.feed(*(h.message("short", {"i": i}) for i in range(3000)))
        await h.recorder.wait_for(3000)
        # The pool only grows when a queued job waits 20 ms untaken.
        assert 1 <= h.processor.pool.threads < 64

    run(main)


def test_arguments_that_do_not_fit_the_handler_fail_as_payload_errors() -> None:
    async def main() -> None:
        app = make_app()

        @app.job("strict")
        async def strict(a: int) -> None:
            return None

        @app.job("strict_sync")
        def strict_sync(a: int) -> None:
            raise TypeError("raised inside the handler")

        h = Harness(app)
        h.feed(
            h.message("strict", {"b": 1}),
            h.message("strict_sync", {"b": 1}),
            h.message("strict_sync", {"a": 1}),
        )
        outcomes = sorted(await h.recorder.wait_for(3), key=lambda o: o.offset)
        assert isinstance(outcomes[0].error, PayloadValidationError)
        assert isinstance(outcomes[1].error, PayloadValidationError)
        assert type(outcomes[2].error) is TypeError  # not a payload problem

    run(main)


def test_undecodable_and_unknown_messages_are_skipped_past() -> None:
    async def main() -> None:
        app = make_app()

        @app.job("known")
        async def known() -> None:
            return None

        h = Harness(app)
        h.feed(
            h.message("known", value=b"\x00garbage"),
            h.message("nobody-handles-this"),
            h.message("known"),
            h.message(
                "known", value=b'{"id": "1", "type": "known", "payload": "[1]", "attempt": 1}'
            ),
        )
        outcomes = await h.recorder.wait_for(4)
        kinds = {o.offset: o.kind for o in outcomes}
        assert kinds == {
            0: OutcomeKind.UNDECODABLE,
            1: OutcomeKind.UNKNOWN_TYPE,
            2: OutcomeKind.SUCCEEDED,
            3: OutcomeKind.FAILED,  # the payload is not an object
        }
        assert outcomes[0].raw == b"\x00garbage"
        assert h.partition.commit_offset == 4
        assert h.metrics.undecodable == {"decode_error": 1, "unknown_type": 1}

    run(main)


def test_a_message_delivered_twice_runs_once() -> None:
    runs: list[int] = []

    async def main() -> None:
        app = make_app()

        @app.job("once")
        async def once(i: int) -> None:
            runs.append(i)

        h = Harness(app)
        first = [h.message("once", {"i": i}) for i in range(3)]
        h.feed(*first)
        h.feed(*first[1:], h.message("once", {"i": 3}))  # a resume racing a fetch re-delivers
        await h.recorder.wait_for(4)
        assert h.metrics.duplicates == 2
        assert h.partition.taken == h.partition.handed

    run(main)
    assert runs == [0, 1, 2, 3]


def test_the_context_describes_the_job() -> None:
    contexts: list[JobContext] = []

    async def main() -> None:
        app = make_app()

        @app.job("ctx", time_limit=30)
        async def with_ctx(x: int, ctx: JobContext) -> None:
            contexts.append(ctx)
            ctx.progress(0.5, "half")

        h = Harness(app)
        h.feed(h.message("ctx", {"x": 1}, key=b"k"))
        await h.recorder.wait_for(1)
        assert h.metrics.progress == 1

    run(main)
    [ctx] = contexts
    assert (ctx.id, ctx.type, ctx.offset, ctx.partition, ctx.key) == ("job-0", "ctx", 0, 0, b"k")
    assert ctx.topic.endswith(".jobs.default")
    assert ctx.deadline is not None
    assert 0 < (ctx.time_left() or 0) <= 30
    assert (ctx.progress_fraction, ctx.progress_detail) == (0.5, "half")
    with pytest.raises(ValueError, match="between 0 and 1"):
        ctx.progress(1.5)


def test_the_global_concurrency_is_never_exceeded() -> None:
    async def main() -> None:
        app = make_app()
        running = 0
        peak = 0

        @app.job("busy")
        async def busy() -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.001)
            running -= 1

        h = Harness(app, concurrency=3)
        h.feed(*(h.message("busy") for _ in range(30)))
        await h.recorder.wait_for(30)
        assert peak == 3

    run(main)


class Holding(Middleware):
    """An outcome hook that finishes later (e.g. a produce waiting for its acknowledgement)."""

    def __init__(self) -> None:
        self.pending: asyncio.Future[None] | None = None

    def on_outcome(self, outcome: Outcome) -> Awaitable[None] | None:
        self.pending = asyncio.get_running_loop().create_future()
        return self.pending


def test_an_outcome_hook_holds_the_offset_until_its_awaitable_is_done() -> None:
    async def main() -> None:
        app = make_app()

        @app.job("x")
        async def x() -> None:
            return None

        holding = Holding()
        h = Harness(app, middleware=[holding])
        h.feed(h.message("x"))
        await h.recorder.wait_for(1)
        assert holding.pending is not None
        assert h.partition.commit_offset == -1
        assert h.processor.in_flight == 1
        holding.pending.set_result(None)
        while h.processor.in_flight:
            await asyncio.sleep(0)
        assert h.partition.commit_offset == 1

    run(main)


class Failing(Middleware):
    def on_outcome(self, outcome: Outcome) -> Awaitable[None] | None:
        raise RuntimeError("the dead-letter topic is unreachable")


def test_a_failing_outcome_hook_keeps_the_offset_unfinished() -> None:
    async def main() -> None:
        app = make_app()

        @app.job("x")
        async def x() -> None:
            return None

        h = Harness(app, middleware=[Failing()])
        h.feed(h.message("x"), h.message("x"))
        await h.recorder.wait_for(2)
        assert h.partition.commit_offset == -1  # never past a job whose outcome was not handled
        assert h.processor.stuck == 2
        assert h.processor.in_flight == 0
        assert h.metrics.hook_failures == 2

    run(main)


def test_a_cancelled_outcome_hook_frees_its_job_s_slot() -> None:
    """A hook's awaitable cancelled (a middleware dropping its pending sends): the wait for it
    ended with the CancelledError, nothing resolved the job, and its slot stayed taken for
    good; with every slot so taken, the worker ran nothing more, and said nothing."""

    async def main() -> None:
        app = make_app()

        @app.job("x")
        async def x() -> None:
            return None

        holding = Holding()
        h = Harness(app, middleware=[holding], concurrency=1)
        h.feed(h.message("x"), h.message("x"))
        await h.recorder.wait_for(1)
        assert holding.pending is not None
        holding.pending.cancel()
        await h.recorder.wait_for(2)  # the second job got the slot
        assert h.processor.stuck == 1  # the first one's offset stays unfinished
        assert h.metrics.hook_failures == 1

    run(main)


def test_a_job_given_up_at_a_revocation_is_not_an_offset_a_hook_kept() -> None:
    """A job that outlived its partition's revocation ended on the released partition: its
    offset counted as kept by a failed outcome hook, and a --burst worker then exited 1,
    "cannot drain: outcome hooks failed"."""

    async def main() -> None:
        app = make_app()
        gate = asyncio.Event()
        started = asyncio.Event()

        @app.job("slow")
        async def slow() -> None:
            started.set()
            await gate.wait()

        h = Harness(app)
        h.feed(h.message("slow"))
        await started.wait()
        h.partition.active = False
        h.partition.released = True  # the revocation's grace ran out
        gate.set()
        await h.recorder.wait_for(1)
        assert await h.processor.wait_idle([h.partition], 5.0)
        assert h.processor.stuck == 0
        assert h.partition.commit_offset == -1  # not finished: the next owner runs it

    run(main)


def test_tombstones_and_codec_crashes_are_undecodable_not_fatal() -> None:
    async def main() -> None:
        app = make_app()

        @app.job("known")
        async def known() -> None:
            return None

        h = Harness(app)
        tombstone = h.message("known")
        tombstone.set_value(None)
        h.feed(tombstone, h.message("known", value=b"crash"), h.message("known"))
        outcomes = await h.recorder.wait_for(3)
        assert [o.kind for o in outcomes[:2]] == [OutcomeKind.UNDECODABLE] * 2
        assert "tombstone" in str(outcomes[0].error)
        assert "a bug in the codec" in str(outcomes[1].error)
        assert outcomes[2].kind is OutcomeKind.SUCCEEDED
        assert h.partition.commit_offset == 3

    run(main)


def test_a_rate_limit_takes_the_share_of_its_priority_topic() -> None:
    async def main() -> None:
        app = make_app()

        @app.job("limited", rate_limit=60.0, priority="high")
        async def limited() -> None:
            return None

        @app.job("everywhere", rate_limit=60.0, priority="critical")
        async def everywhere() -> None:
            return None

        h = Harness(app, priorities=["high", "default"])
        high, default = app.topics.jobs("high"), app.topics.jobs("default")
        h.feed(h.message("limited"), h.message("everywhere"))
        await h.recorder.wait_for(2)
        h.processor.set_share({high: 1, default: 6}, {high: 6, default: 6})
        limits = {name: e.limit for name, e in h.processor.types.entries.items()}
        assert limits["limited"] is not None
        assert limits["limited"].rate == pytest.approx(10.0)  # 1 of the 6 high partitions
        assert limits["everywhere"] is not None
        assert limits["everywhere"].rate == pytest.approx(35.0)  # critical is not consumed: 7/12

    run(main)


def test_a_worker_owning_none_of_a_types_topic_takes_its_share_of_every_topic() -> None:
    """Its jobs of that type were enqueued at another priority: a share of 0 would hold them
    (and their partition's commit point) for good."""

    async def main() -> None:
        app = make_app()

        @app.job("limited", rate_limit=60.0, priority="high")
        async def limited() -> None:
            return None

        h = Harness(app, priorities=["high", "default"])
        high, default = app.topics.jobs("high"), app.topics.jobs("default")
        h.feed(h.message("limited"))
        await h.recorder.wait_for(1)
        h.processor.set_share({high: 0, default: 3}, {high: 1, default: 6})
        limit = h.processor.types.entries["limited"].limit
        assert limit is not None
        assert limit.rate == pytest.approx(60.0 * 3 / 7)

    run(main)


class HeldRouter:
    """Moves failures like the real mover (settled later, from the loop), but only when the
    test says so: the batch that freed a handler has been pumped long before."""

    def __init__(self) -> None:
        self.routed: list[int] = []
        self.unsettled: list[Callable[[bool], None]] = []
        self.changed = asyncio.Event()

    def route(
        self, failure: Any, settle: Callable[[bool], None], keys: Any = None, state: Any = None
    ) -> None:
        self.routed.append(failure.offset)
        self.unsettled.append(settle)
        self.changed.set()

    def settle_all(self) -> None:
        unsettled, self.unsettled = self.unsettled, []
        for settle in unsettled:
            settle(True)


async def until(
    condition: Callable[[], bool], changed: asyncio.Event, timeout: float = 5.0
) -> None:
    """Wait until ``condition`` holds, looking again each time ``changed`` is set."""

    async def wait() -> None:
        while not condition():
            changed.clear()
            await changed.wait()

    await asyncio.wait_for(wait(), timeout)


def test_a_slot_freed_by_a_move_starts_the_next_queued_job() -> None:
    """Every slot taken by a failing job and more jobs queued, no batch coming: the move that
    frees a slot must start the next job, or the partition stalls with jobs in its queue."""

    async def main() -> None:
        app = make_app()

        @app.job("fails")
        def fails() -> None:
            raise RuntimeError("on purpose")

        router = HeldRouter()
        h = Harness(app, router=router, concurrency=2)
        h.feed(*(h.message("fails") for _ in range(6)))
        for started in (2, 4, 6):

            def both_slots_wait(n: int = started) -> bool:
                return len(router.unsettled) == 2 and len(router.routed) == n

            await until(both_slots_wait, router.changed)
            router.settle_all()
        assert router.routed == list(range(6))
        assert h.partition.commit_offset == 6
        assert h.processor.in_flight == 0

    run(main)


def test_a_job_given_up_at_revocation_is_not_moved_when_it_fails_later() -> None:
    """Its partition may be this worker's again by then: a move would land in the next
    assignment, which runs the job again and moves it a second time."""

    async def main() -> None:
        app = make_app()
        release = threading.Event()

        @app.job("slow_failure")
        def slow_failure() -> None:
            release.wait(10)
            raise RuntimeError("downstream down")

        router = HeldRouter()
        h = Harness(app, router=router, concurrency=2)
        h.feed(h.message("slow_failure"))
        state = h.partition
        await until(lambda: state.in_flight == 1, router.changed, timeout=1.0)
        state.active = False  # the revocation, as the worker's revoke() does it...
        assert not await h.processor.wait_idle([state], 0.05)
        state.released = True  # ...and the grace period over: the job was given up
        release.set()
        await h.processor.wait_idle([state], 5.0)
        assert router.routed == []
        assert state.in_flight == 0
        assert h.processor.in_flight == 0
        assert state.commit_offset == -1  # unfinished: the next owner runs it again

    run(main)


def test_a_message_that_never_ran_given_up_at_revocation_is_not_moved_when_its_hook_ends() -> None:
    """An undecodable message (a poison pill, a job of no type alike) waits for a slow
    ``on_outcome`` hook before its dead letter: given up meanwhile with its partition, the
    letter was still written, and could land in the partition's next assignment, which
    dead-letters the message a second time."""

    class SlowOutcomes(Middleware):
        def __init__(self) -> None:
            self.gate = asyncio.Event()

        def on_outcome(self, outcome: Outcome) -> Awaitable[None] | None:
            return self._wait()

        async def _wait(self) -> None:
            await self.gate.wait()

    async def main() -> None:
        hook = SlowOutcomes()
        router = HeldRouter()
        h = Harness(make_app(), router=router, middleware=[hook])
        h.feed(h.message("any", value=b"\x00not a job"))
        state = h.partition
        assert state.in_flight == 1  # waiting for the hook
        state.active = False  # the revocation, as the worker's revoke() does it...
        state.released = True  # ...and the grace period over: the message was given up
        hook.gate.set()
        idle = await h.processor.wait_idle([state], 5.0)
        assert router.routed == []
        assert idle
        assert state.commit_offset == -1  # unfinished: the next owner reads it again

    run(main)


def test_a_payload_codec_that_fails_otherwise_than_told_fails_its_job_and_nothing_else() -> None:
    """Its KeyError escaped the start of jobs: the jobs taken with it never started, their
    slots stayed taken and the partition stopped."""

    async def main() -> None:
        app = make_app()
        ran: list[int] = []

        @app.job("t")
        def t(n: int) -> None:
            if n == 1:
                raise AssertionError("never run: its payload cannot be read")
            ran.append(n)

        entry_load = None

        def load(payload: bytes) -> dict[str, Any]:
            if b'"n": 1' in payload:
                raise KeyError("codec bug")
            assert entry_load is not None
            return entry_load(payload)

        h = Harness(app, concurrency=1)
        entry = h.processor.types.find("t")
        assert entry is not None
        entry_load, entry.loads[PayloadEncoding.JSON] = entry.loads[PayloadEncoding.JSON], load
        h.feed(*(h.message("t", {"n": n}) for n in range(4)))
        outcomes = await h.recorder.wait_for(4)
        assert [(o.offset, o.kind) for o in outcomes] == [
            (0, OutcomeKind.SUCCEEDED),
            (1, OutcomeKind.FAILED),
            (2, OutcomeKind.SUCCEEDED),
            (3, OutcomeKind.SUCCEEDED),
        ]
        assert "payload codec of 't' failed: KeyError" in str(outcomes[1].error)
        assert ran == [0, 2, 3]
        assert h.partition.commit_offset == 4

    run(main)


class _Passing:
    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        return await next(call)


class _Runs:
    """Which jobs' handlers run now, and every start that overlapped another."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: set[int] = set()
        self.started: list[int] = []
        self.overlaps: list[tuple[int, set[int]]] = []

    def enter(self, i: int) -> None:
        with self.lock:
            if self.running:
                self.overlaps.append((i, set(self.running)))
            self.running.add(i)
            self.started.append(i)

    def leave(self, i: int) -> None:
        with self.lock:
            self.running.discard(i)


@pytest.mark.parametrize("interceptors", [False, True], ids=["bare", "intercepted"])
@pytest.mark.parametrize("kind", ["plain", "coroutine"])
def test_a_job_past_its_time_limit_keeps_its_key_and_cap_until_its_handler_is_out(
    kind: str, interceptors: bool
) -> None:
    """Its slot is free at the deadline, but a key's jobs never run at the same time, nor more
    of a type than its cap: the next job of the key waits until the handler is out. A plain
    function's thread cannot be stopped; a coroutine may carry on after its cancellation (a
    long clean-up, or it swallows it). With an interceptor too, whose chain runs on a runner."""

    async def main() -> None:
        middleware = [_Passing()] if interceptors else []
        app = Pipeline(transport=InMemoryTransport(), middleware=middleware)
        runs = _Runs()
        thread_go = threading.Event()
        coroutine_go = asyncio.Event()

        if kind == "plain":

            @app.job("slow", time_limit=0.05, concurrency=1)
            def slow(i: int) -> None:
                runs.enter(i)
                thread_go.wait(5)
                runs.leave(i)

        else:

            @app.job("slow", time_limit=0.05, concurrency=1)
            async def slow(i: int) -> None:
                runs.enter(i)
                try:
                    await coroutine_go.wait()
                except asyncio.CancelledError:
                    await coroutine_go.wait()  # carries on after its cancellation
                finally:
                    runs.leave(i)

        h = Harness(app, concurrency=4, threads=2, key_ordering=True)
        h.feed(*(h.message("slow", {"i": i}, key=b"k") for i in range(3)))
        limit = h.processor.types.entries["slow"].limit
        assert limit is not None
        try:
            timed_out = await h.recorder.wait_for(1)
            assert timed_out[0].kind is OutcomeKind.TIMED_OUT
            # Job 0's slot was freed at its deadline, and the jobs after it were pumped then:
            # job 1 waits for the key (with it free, it would be running by now).
            assert h.processor.in_flight == 0
            assert limit.running == 1  # job 0's handler holds its type's slot
        finally:
            thread_go.set()  # the handlers end, whatever the assertions said
            coroutine_go.set()
        outcomes = await h.recorder.wait_for(3)
        assert [o.kind for o in outcomes] == [
            OutcomeKind.TIMED_OUT,
            OutcomeKind.SUCCEEDED,
            OutcomeKind.SUCCEEDED,
        ]
        assert runs.started == [0, 1, 2]
        assert runs.overlaps == []
        assert limit.running == 0

    run(main)


def test_a_plain_function_past_its_time_limit_before_a_thread_took_it_is_not_run() -> None:
    async def main() -> None:
        app = make_app()
        started: list[int] = []
        release = threading.Event()

        @app.job("slow", time_limit=30)
        def slow(i: int) -> None:
            started.append(i)
            release.wait(30)

        @app.job("quick", time_limit=0.05)
        def quick(i: int) -> None:
            started.append(i)

        # Job 0 holds the one thread, within its limit: no thread is lent (a job ended on its
        # thread lends one, which could take job 1 before job 1's own deadline).
        h = Harness(app, concurrency=2, threads=1)
        h.feed(h.message("slow", {"i": 0}), h.message("quick", {"i": 1}))
        outcomes = await h.recorder.wait_for(1)
        assert [(o.kind, o.job and o.job.type) for o in outcomes] == [
            (OutcomeKind.TIMED_OUT, "quick")
        ]
        release.set()
        outcomes = await h.recorder.wait_for(2)
        assert outcomes[1].kind is OutcomeKind.SUCCEEDED
        await h.processor.close()
        for thread in h.processor._pool._threads:
            thread.join(5)
        assert started == [0]  # job 1 was failed at its deadline, waiting for the thread

    run(main)


def test_closing_leaves_behind_a_job_that_ignores_its_cancellation() -> None:
    """close() waited for it without a bound: the worker's shutdown hung for good."""

    async def main() -> None:
        app = make_app()
        started = asyncio.Event()
        released = asyncio.Event()

        @app.job("deaf")
        async def deaf() -> None:
            started.set()
            for _ in range(2):  # not for ever: a failing test must not hang the run
                with contextlib.suppress(asyncio.CancelledError):
                    await released.wait()
                    return
            await released.wait()

        h = Harness(app)
        h.feed(h.message("deaf"))
        await asyncio.wait_for(started.wait(), 5)
        h.processor.stopping = True
        closing = asyncio.create_task(h.processor._runners.close(timeout_s=0.01))
        await asyncio.wait_for(closing, 5)
        released.set()  # let it end, so that the loop closes clean

    run(main)


def test_closing_ends_a_runner_whose_job_cleans_up_after_its_time_limit() -> None:
    """The runner took back every cancel after a job past its time limit, close()'s too: it
    went on idling, and the worker's shutdown waited for it for good."""

    async def main() -> None:
        app = make_app()
        cleaning = asyncio.Event()

        @app.job("stubborn", time_limit=0.05)
        async def stubborn() -> None:
            try:
                await asyncio.Event().wait()  # a reply that never comes
            except asyncio.CancelledError:
                cleaning.set()
                await asyncio.Event().wait()  # a cleanup only the shutdown's cancel ends
                raise

        h = Harness(app)
        h.feed(h.message("stubborn"))
        await asyncio.wait_for(cleaning.wait(), 5)
        h.processor.stopping = True
        await asyncio.wait_for(h.processor.close(), 5)

    run(main)


def test_a_job_runs_as_its_envelope_says_its_payload_is_encoded() -> None:
    """A type moved from JSON to Avro: its jobs written before (waiting on a retry or deferred
    topic) state JSON, and were dead-lettered by the Avro codec ("it looks like JSON")."""
    schema = {
        "type": "record",
        "name": "Email",
        "namespace": "acme",
        "fields": [{"name": "to", "type": "string"}],
    }

    async def main() -> None:
        app = make_app()
        ran: list[str] = []

        @app.job("email.send", payload=AvroPayload(schema))
        def send(to: str) -> None:
            ran.append(to)

        @app.job("plain")
        def plain(to: str) -> None:
            ran.append(to)

        h = Harness(app, concurrency=1)
        avro = AvroPayload(schema).encode("email.send", {"to": "avro"})
        jobs = [
            Job(id="a", type="email.send", payload=avro, payload_encoding=PayloadEncoding.AVRO),
            Job(id="j", type="email.send", payload=b'{"to": "json"}'),  # JSON by default
            Job(id="p", type="plain", payload=avro, payload_encoding=PayloadEncoding.AVRO),
        ]
        h.feed(*(h.message(job.type, value=app.codec.encode(job)) for job in jobs))
        outcomes = await h.recorder.wait_for(3)
        assert [o.kind for o in outcomes[:2]] == [OutcomeKind.SUCCEEDED] * 2
        assert outcomes[2].kind is OutcomeKind.FAILED
        assert "is AVRO, and job type 'plain' reads JSON payloads" in str(outcomes[2].error)
        assert ran == ["avro", "json"]

    asyncio.run(main())
