"""SIGTERM/SIGINT, from the first import to the last line of the process.

An orchestrator may stop a worker at any moment, also while the interpreter still imports the
application. The command installs the handler first thing (:func:`catch_early`): a signal then
means "do not start" (exit 0, nothing was consumed). While the worker runs, :class:`LoopSignals`
turns the first signal into a graceful stop on the event loop. At any time, a second signal
exits at once without committing.

One handler, a plain ``signal.signal`` one, for the whole life of the process, so that:

* a second signal works while the event loop is blocked (a handler that sleeps, a long sync
  call on the loop): Python runs the handler as soon as the main thread runs bytecode again,
  a sleep included, where a handler of the loop would wait for the loop;
* the count survives the phases: a signal during the final exit, after the loop's part is
  over, is still a second one;
* the same stop request delivered twice is one: a service manager (systemd's default
  ``KillMode=control-group``) signals every process of the unit, and a ``--processes``
  supervisor forwards its own copy to each child. A signal within
  :data:`REPEAT_WINDOW_S` of the first counts as that first one.

A graceful stop has a budget (:class:`StopBudget`): what follows the final commit gets what is
left of it, each step on a daemon thread of its own, so that one that hangs is named in the log
and left behind instead of keeping the process up until the orchestrator kills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

EXIT_INTERRUPTED = 130
SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_WINDOW_S = 1.0
"""A signal this soon after the first is the same stop request, delivered twice."""

_log = logging.getLogger("pipeline.worker")


class _Stops:
    """What the process was told so far (main thread: signal handlers run there)."""

    first: signal.Signals | None = None
    first_at = 0.0
    on_first: Callable[[signal.Signals], None] | None = None
    """Set while the event loop runs: hands the first signal to it."""
    clock: Callable[[], float] = time.monotonic
    exit: Callable[[int], Any] = os._exit


def _on_signal(signum: int, frame: FrameType | None) -> None:
    sig = signal.Signals(signum)
    now = _Stops.clock()
    if _Stops.first is None:
        _Stops.first, _Stops.first_at = sig, now
        if _Stops.on_first is not None:
            _Stops.on_first(sig)
        return
    if now - _Stops.first_at < REPEAT_WINDOW_S:
        return  # the first request again (see the module docstring)
    _log.warning("%s received again: exiting now without committing", sig.name)
    for handler in logging.getLogger().handlers:
        handler.flush()
    _Stops.exit(EXIT_INTERRUPTED)


def catch_early() -> None:
    """Record SIGTERM/SIGINT instead of dying of them (main thread only)."""
    for sig in SIGNALS:
        signal.signal(sig, _on_signal)


def received() -> bool:
    """Whether a stop signal arrived."""
    return _Stops.first is not None


class LoopSignals:
    """The first SIGTERM/SIGINT stops the worker gracefully on its event loop (main thread
    only: a worker embedded in another thread is stopped by its host)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, stop: Callable[[], None], timeout_s: float
    ) -> None:
        self._loop = loop
        self._stop = stop
        self._timeout_s = timeout_s
        self._on = threading.current_thread() is threading.main_thread()
        self._before: dict[signal.Signals, Any] = {}

    def install(self) -> None:
        if not self._on:
            return
        for sig in SIGNALS:
            self._before[sig] = signal.signal(sig, _on_signal)
        _Stops.on_first = self._on_first
        if _Stops.first is not None:  # came after the start-up's look, before this
            self._on_first(_Stops.first)

    def remove(self) -> None:
        """The loop's part is over: a first signal from now on is only recorded, a second
        one still exits at once. Handlers that were there before :meth:`install` come back
        (a worker run by a host that did not call :func:`catch_early`)."""
        if not self._on:
            return
        _Stops.on_first = None
        for sig, before in self._before.items():
            if before is not _on_signal:
                signal.signal(sig, before)

    def _on_first(self, sig: signal.Signals) -> None:
        # In the signal handler: only hand over (the log line and the stop run on the loop).
        self._loop.call_soon_threadsafe(self._stopping, sig)

    def _stopping(self, sig: signal.Signals) -> None:
        _log.info(
            "%s received: stopping gracefully (a second signal exits at once)",
            sig.name,
            extra={"timeout_s": self._timeout_s},
        )
        self._stop()


class StopBudget:
    """The time a graceful stop may take, from its start, and its steps bounded by what is left.

    A blocking step runs on a daemon thread of its own (the loop's default executor would be
    joined at exit, hung or not); a coroutine step is cancelled. Either way the stop goes on.
    """

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._deadline = clock() + seconds

    def left(self) -> float:
        """Seconds left (0 once it is spent)."""
        return max(0.0, self._deadline - self._clock())

    async def call(self, name: str, step: Callable[[], object]) -> bool:
        """Run the blocking ``step`` for at most what is left; False (logged) if it ran out.
        It is started even with no time left: a stage asked to stop (the retry relay, the
        metrics server) stops on its thread, also in a process that goes on after the worker."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def finished() -> None:
            if not done.done():
                done.set_result(None)

        def run() -> None:
            try:
                step()
            except Exception:
                _log.exception("stopping: %s failed", name)
            finally:
                with contextlib.suppress(RuntimeError):  # the loop is closed: we are gone
                    loop.call_soon_threadsafe(finished)

        threading.Thread(target=run, name=f"pipeline-stop-{name}", daemon=True).start()
        return await self.wait(name, done)

    async def wait(self, name: str, step: Awaitable[object], at_most: float | None = None) -> bool:
        """Await ``step`` for at most what is left (cancelled after), or ``at_most`` seconds if
        that is less; False (logged) if it ran out of time. It is started even with no time
        left (its first step runs: closing the executors stops the pool and cancels the
        runners there), as :meth:`call` does."""
        left = self.left() if at_most is None else min(at_most, self.left())
        task = asyncio.ensure_future(step)
        await asyncio.wait({task}, timeout=left)  # yields once at least: the task starts
        if not task.done():
            task.cancel()
            self._left_behind(
                name,
                "did not finish within the shutdown budget; left behind"
                if left
                else "had no time left; started, not waited for",
            )
            return False
        if not task.cancelled() and task.exception() is not None:
            _log.error("stopping: %s failed", name, exc_info=task.exception())
        return True

    def spent(self, name: str) -> bool:
        """Whether no time is left, logged as ``name`` left behind: for a step that need not
        start then (user code, which may hang as the step before it did)."""
        if self.left():
            return False
        self._left_behind(name, "had no time left; not started")
        return True

    def _left_behind(self, name: str, what: str) -> None:
        _log.error("stopping: %s %s", name, what, extra={"budget_s": self.seconds})
