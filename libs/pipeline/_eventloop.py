"""Event loops made and closed so that nothing left running on them holds the process.

``asyncio.run`` (and ``asyncio.Runner``) end by waiting, with no bound, for every task still
pending once they cancelled them, and for the threads of the loop's default executor. What a
stop or a time limit leaves behind would not end: a coroutine job that catches its cancellation
and carries on, a job awaiting ``asyncio.to_thread`` on a call that hangs. A worker then stayed
up after its stop was complete (offsets committed, group left) until the orchestrator killed it,
its exit code lost; a test of the test kit hung for good. Here a loop gives its last tasks
:data:`LEFT_BEHIND_S` after cancelling them, and its default executor runs calls on daemon
threads, which the interpreter does not wait for at exit: :func:`run_loop` for a worker's run,
:class:`BoundedRunner` for the test kit's runs, one after the other on one loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import os
import queue
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LEFT_BEHIND_S", "BoundedRunner", "DaemonThreads", "run_loop"]

_log = logging.getLogger("pipeline")

T = TypeVar("T")

LEFT_BEHIND_S = 1.0
"""How long the tasks still pending when a loop closes get, once cancelled."""

_left_behind: list[asyncio.Task[Any]] = []
"""Tasks that ignored their cancellation at exit: kept, not destroyed pending (which asyncio
reports as an error, and which throws into the coroutine once more) while the process ends."""


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on a new event loop, then close it without waiting for good (see the
    module docstring)."""
    with BoundedRunner() as runner:
        return runner.run(main)


class BoundedRunner:
    """What the test kit needs of ``asyncio.Runner``: coroutines run one after the other on
    one loop, each in a ``contextvars`` context of the caller's choosing; closed without
    waiting for good (see the module docstring). Use it on one thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        """Made by the first run (as ``asyncio.Runner`` does): a runner never used holds none."""

    def run(self, main: Coroutine[Any, Any, T], *, context: contextvars.Context | None = None) -> T:
        """Run ``main`` to its end on the loop (in ``context``; None: a copy of this one's)."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.new_event_loop()
            loop.set_default_executor(DaemonThreads())
        return loop.run_until_complete(loop.create_task(main, context=context))

    def close(self) -> None:
        """Cancel what still runs, give it :data:`LEFT_BEHIND_S`, close the loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            _cancel_the_rest(loop)
        finally:
            loop.close()

    def __enter__(self) -> BoundedRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _cancel_the_rest(loop: asyncio.AbstractEventLoop) -> None:
    left = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in left:
        task.cancel()
    closing = loop.create_task(loop.shutdown_asyncgens())
    _, pending = loop.run_until_complete(asyncio.wait([*left, closing], timeout=LEFT_BEHIND_S))
    if pending:
        _left_behind.extend(pending)
        _log.warning(
            "%d task(s) ignored their cancellation at exit: left behind", len(pending),
            extra={"tasks": sorted(task.get_name() for task in pending)[:10]},
        )  # fmt: skip


class DaemonThreads(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor (``asyncio.to_thread``, ``run_in_executor(None, ...)``):
    calls run on up to ``max_workers`` daemon threads, started as needed and kept, so that a
    call still running at exit does not hold the process (the standard pool's threads are
    joined at exit, for good). A ``ThreadPoolExecutor`` only in name, which asyncio requires of
    a default executor: its own threads are never started."""

    def __init__(self, max_workers: int | None = None) -> None:
        super().__init__(max_workers)
        self._max = max_workers or min(32, (os.cpu_count() or 1) + 4)
        self._calls: queue.SimpleQueue[Callable[[], Callable[[], None]] | None] = (
            queue.SimpleQueue()
        )
        self._daemons: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._shut = False

    def submit(
        self, fn: Callable[..., T], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> Callable[[], None]:
            """Make the call; what tells its outcome (after the thread counts as idle)."""
            if not future.set_running_or_notify_cancel():
                return _nothing
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                return functools.partial(future.set_exception, exc)
            return functools.partial(future.set_result, result)

        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._calls.put(call)
            if self._idle == 0 and len(self._daemons) < self._max:
                thread = threading.Thread(
                    target=self._serve, name=f"pipeline-thread-{len(self._daemons)}", daemon=True
                )
                self._daemons.append(thread)
                thread.start()
            else:
                self._idle -= 1
        return future

    def _serve(self) -> None:
        while True:
            call = self._calls.get()
            if call is None:
                return
            tell = call()
            with self._lock:
                self._idle += 1
            tell()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            threads = list(self._daemons)
        for _ in threads:
            self._calls.put(None)
        if wait:
            for thread in threads:
                thread.join()


def _nothing() -> None:
    """The outcome of a call cancelled before it ran: told already."""
