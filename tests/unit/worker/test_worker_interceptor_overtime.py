"""An interceptor that ends a plain function's job before its thread is back (it stopped
waiting for ``next``): the thread keeps the job's key and its type's and tenant's slots until
it returns, as a plain function past its time limit does; only the concurrency slot is free."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from pipeline import CallNext, JobCall, Pipeline
from pipeline.testing import InMemoryTransport
from pipeline_worker import OutcomeKind

from .support import Harness


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


class GivesUp:
    """Stops waiting for the first job's handler (``i == 0``) once it runs on its thread, as
    ``asyncio.wait_for(next(call), ...)`` does at its timeout: raises the timeout, answers for
    the handler, or leaves ``next`` running in a task of its own (that awaits the thread)."""

    def __init__(self, how: str, entered: asyncio.Event) -> None:
        self.how = how
        self.entered = entered
        self.tasks: set[asyncio.Task[Any]] = set()

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        if call.kwargs["i"] != 0:
            return await next(call)
        task = asyncio.ensure_future(next(call))
        self.tasks.add(task)
        await self.entered.wait()
        if self.how == "detaches":
            return "detached"  # the chain ends; the task still awaits the thread
        task.cancel()
        if self.how == "raises":
            raise TimeoutError("gave up on the handler")
        return "answered"


class Overlaps:
    """A plain handler that records overlapping runs; job 0 sets ``entered`` (an event of the
    loop's), then blocks until ``release``; any other job sets ``later`` as it starts."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.later = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock = threading.Lock()
        self.running: set[int] = set()
        self.started: list[int] = []
        self.overlaps: list[tuple[int, set[int]]] = []
        self.release = threading.Event()

    def __call__(self, i: int) -> None:
        with self.lock:
            if self.running:
                self.overlaps.append((i, set(self.running)))
            self.running.add(i)
            self.started.append(i)
        if i == 0:
            assert self.loop is not None
            self.loop.call_soon_threadsafe(self.entered.set)
            self.release.wait(10)
        else:
            assert self.loop is not None
            self.loop.call_soon_threadsafe(self.later.set)
        with self.lock:
            self.running.discard(i)


HELD: dict[str, tuple[dict[str, Any], dict[str, Any], bytes | None, str | None]] = {
    # what the thread holds: the job type's options, the worker's settings, the messages' key
    # and tenant
    "key": ({}, {"key_ordering": True}, b"k", None),
    "type cap": ({"concurrency": 1}, {}, None, None),
    "tenant cap": ({}, {"tenants": {"named": {"acme": {"concurrency": 1}}}}, None, "acme"),
}


@pytest.mark.parametrize("held", list(HELD))
@pytest.mark.parametrize("how", ["raises", "answers", "detaches"])
def test_a_plain_function_an_interceptor_gave_up_on_keeps_its_slots_until_its_thread_is_back(
    held: str, how: str
) -> None:
    """The chain's end freed the key and the caps at once while the thread still ran the
    handler: the next job of the key, type or tenant ran beside it."""
    handler = Overlaps()
    options, settings, key, tenant = HELD[held]

    async def main() -> None:
        handler.loop = asyncio.get_running_loop()
        interceptor = GivesUp(how, handler.entered)
        app = Pipeline(transport=InMemoryTransport(), middleware=[interceptor])
        app.job("slow", **options)(handler)
        h = Harness(app, concurrency=4, threads=2, **settings)
        h.processor.set_share({"t": 1}, {"t": 1})  # the whole of the tenant's cap
        pool = h.processor.pool
        h.feed(*(h.message("slow", {"i": i}, key=key, tenant=tenant) for i in range(3)))
        try:
            [first] = await h.recorder.wait_for(1)
            expected = OutcomeKind.FAILED if how == "raises" else OutcomeKind.SUCCEEDED
            assert first.kind is expected
            # Its concurrency slot is free and a thread is lent in place of the kept one, but
            # job 1 waits for what job 0's thread still holds (else it would be running now).
            assert h.processor.in_flight == 0
            assert pool.overdue == 1  # pipeline_worker_threads_overdue
            assert handler.started == [0]
        finally:
            handler.release.set()
        outcomes = await h.recorder.wait_for(3)
        assert [o.kind for o in outcomes[1:]] == [OutcomeKind.SUCCEEDED] * 2
        assert handler.started == [0, 1, 2]
        assert handler.overlaps == []
        assert pool.overdue == 0
        assert h.partition.commit_offset == 3
        await asyncio.gather(*interceptor.tasks, return_exceptions=True)

    run(main)


def test_without_outcome_hooks_a_chain_that_answered_early_keeps_the_key_too() -> None:
    """The inlined success (no middleware to tell) freed the key itself."""
    handler = Overlaps()

    async def main() -> None:
        handler.loop = asyncio.get_running_loop()
        interceptor = GivesUp("answers", handler.entered)
        app = Pipeline(transport=InMemoryTransport(), middleware=[interceptor])
        app.job("slow")(handler)
        h = Harness(app, plain=True, concurrency=4, threads=2, key_ordering=True)
        pool = h.processor.pool
        lent = asyncio.Event()
        lend = pool.lend

        def lending() -> None:
            lend()
            lent.set()

        pool.lend = lending  # type: ignore[method-assign]
        h.feed(*(h.message("slow", {"i": i}, key=b"k") for i in range(2)))
        try:
            await asyncio.wait_for(lent.wait(), 5)  # job 0 ended, its thread kept
            assert h.processor.finished == 1
            assert h.processor.in_flight == 0
            assert handler.started == [0]
        finally:
            handler.release.set()
        await asyncio.wait_for(handler.later.wait(), 5)  # job 1, once job 0's thread was back
        assert await h.processor.wait_idle([], 5)  # and its end
        assert h.processor.finished == 2
        assert handler.started == [0, 1]
        assert handler.overlaps == []
        assert pool.overdue == 0
        await asyncio.gather(*interceptor.tasks, return_exceptions=True)

    run(main)


class CleansUp:
    """An interceptor whose clean-up of job 0 after its time limit (a ``finally`` after
    ``next``: closing a connection, say) lasts until ``done`` is set."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.cleaning: set[int] = set()
        self.overlaps: list[tuple[int, set[int]]] = []

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        i = call.kwargs["i"]
        if self.cleaning:
            self.overlaps.append((i, set(self.cleaning)))
        try:
            return await next(call)
        finally:
            if i == 0:
                self.cleaning.add(i)
                try:
                    await self.done.wait()
                finally:
                    self.cleaning.discard(i)


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "coroutine"])
def test_an_interceptors_clean_up_past_the_time_limit_keeps_the_key(plain: bool) -> None:
    """The chain is cancelled at the deadline; its clean-up keeps the job's key until it is
    out of its runner, even when a plain function's thread is back before it."""

    async def main() -> None:
        cleans = CleansUp()
        app = Pipeline(transport=InMemoryTransport(), middleware=[cleans])
        thread_go = threading.Event()

        if plain:

            @app.job("slow", time_limit=0.05)
            def slow(i: int) -> None:
                if i == 0:
                    thread_go.wait(10)

        else:

            @app.job("slow", time_limit=0.05)
            async def slow(i: int) -> None:
                if i == 0:
                    await asyncio.Event().wait()  # until cancelled

        h = Harness(app, concurrency=4, threads=2, key_ordering=True)
        pool = h.processor.pool
        thread_back = asyncio.Event()
        give_back = pool.give_back

        def given_back() -> None:  # on the loop, in the call that also frees what the job kept
            give_back()
            thread_back.set()

        pool.give_back = given_back  # type: ignore[method-assign]
        h.feed(*(h.message("slow", {"i": i}, key=b"k") for i in range(2)))
        try:
            [timed_out] = await h.recorder.wait_for(1)
            assert timed_out.kind is OutcomeKind.TIMED_OUT
            if plain:
                thread_go.set()  # the thread comes back while the clean-up still runs
                await asyncio.wait_for(thread_back.wait(), 10)
                assert pool.overdue == 0
            assert cleans.cleaning == {0}
            assert h.processor.in_flight == 0  # job 1 waits for the key
        finally:
            thread_go.set()
            cleans.done.set()
        outcomes = await h.recorder.wait_for(2)
        assert [o.kind for o in outcomes] == [OutcomeKind.TIMED_OUT, OutcomeKind.SUCCEEDED]
        assert cleans.overlaps == []

    run(main)


class _Swallowing:
    """An interceptor that never lets a job fail: it keeps even the stop's cancellation in."""

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        try:
            return await next(call)
        except BaseException as exc:
            return f"swallowed {type(exc).__name__}"


def test_a_job_the_stop_gave_up_ends_as_never_started_whatever_its_interceptors_do() -> None:
    """The stop cancels the chains: a plain function queued for the pool was never run, and
    the interceptor returned instead of raising: the job was reported as succeeded (its key
    settled as such, and with an application's own store the next owner skipped it)."""

    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport(), middleware=[_Swallowing()])
        blocking, gate = threading.Event(), threading.Event()
        ran: list[str] = []

        @app.job("block")
        def block() -> None:
            blocking.set()
            gate.wait(10)

        @app.job("queued")
        def queued() -> None:
            ran.append("queued")

        h = Harness(app, concurrency=4, threads=1)
        h.feed(h.message("block"), h.message("queued"))
        await asyncio.to_thread(blocking.wait, 10)  # the one pool thread is taken
        h.processor.stopping = True
        await h.processor.close()
        gate.set()
        assert ran == []
        assert h.recorder.outcomes == []
        assert h.partition.commit_offset == -1

    asyncio.run(main())
