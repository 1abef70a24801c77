"""Stop signals: the first stops gracefully, a second exits at once, the same request delivered
twice (service manager and supervisor) is one, and a blocked event loop does not delay an exit."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from pipeline_worker import _signals
from pipeline_worker._signals import EXIT_INTERRUPTED, REPEAT_WINDOW_S, LoopSignals


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def stops(monkeypatch: pytest.MonkeyPatch) -> tuple[Clock, list[int]]:
    """A fresh record of signals, a clock the test moves, and the exits instead of exiting."""
    clock = Clock()
    exits: list[int] = []
    monkeypatch.setattr(_signals._Stops, "first", None)
    monkeypatch.setattr(_signals._Stops, "on_first", None)
    monkeypatch.setattr(_signals._Stops, "clock", clock)
    monkeypatch.setattr(_signals._Stops, "exit", exits.append)
    return clock, exits


def test_a_repeat_within_the_window_is_the_same_request_and_a_later_one_exits(
    stops: tuple[Clock, list[int]],
) -> None:
    clock, exits = stops
    handed: list[signal.Signals] = []
    _signals._Stops.on_first = handed.append
    _signals._on_signal(signal.SIGTERM, None)  # systemd, to every process of the unit
    clock.now += REPEAT_WINDOW_S / 2
    _signals._on_signal(signal.SIGTERM, None)  # the supervisor's copy
    assert (handed, exits) == ([signal.SIGTERM], [])
    clock.now += REPEAT_WINDOW_S
    _signals._on_signal(signal.SIGINT, None)
    assert exits == [EXIT_INTERRUPTED]


def test_a_signal_after_the_loop_s_part_is_over_still_counts(
    stops: tuple[Clock, list[int]],
) -> None:
    clock, exits = stops
    loop = asyncio.new_event_loop()
    try:
        stopped: list[bool] = []
        signals = LoopSignals(loop, lambda: stopped.append(True), 30.0)
        signals.install()
        _signals._on_signal(signal.SIGTERM, None)
        loop.call_soon(loop.stop)
        loop.run_forever()
        assert stopped == [True]
        signals.remove()  # the final exit: hooks, flushes
        clock.now += REPEAT_WINDOW_S * 2
        _signals._on_signal(signal.SIGTERM, None)
        assert exits == [EXIT_INTERRUPTED]
    finally:
        loop.close()


def test_a_signal_before_the_loop_s_handlers_is_handed_to_the_loop_once_they_are(
    stops: tuple[Clock, list[int]],
) -> None:
    _signals._on_signal(signal.SIGTERM, None)  # between the start-up's look and install()
    loop = asyncio.new_event_loop()
    try:
        stopped: list[bool] = []
        signals = LoopSignals(loop, lambda: stopped.append(True), 30.0)
        signals.install()
        loop.call_soon(loop.stop)
        loop.run_forever()
        signals.remove()
        assert stopped == [True]
    finally:
        loop.close()


def test_a_second_signal_exits_while_the_event_loop_is_blocked() -> None:
    """A handler of the loop would wait for the loop: here a job blocks it, waiting on an event
    nothing sets (a plain ``Event.wait`` in the main thread, as a blocking library call)."""
    script = textwrap.dedent(
        """
        import asyncio, threading
        from pipeline_worker import _signals
        _signals.REPEAT_WINDOW_S = 0.0
        _signals.catch_early()

        async def main():
            loop = asyncio.get_running_loop()
            signals = _signals.LoopSignals(loop, lambda: None, 30.0)
            signals.install()
            hand = _signals._Stops.on_first

            def first(sig):
                print("first", flush=True)  # the test sends the second only now
                hand(sig)

            _signals._Stops.on_first = first
            print("blocking", flush=True)
            threading.Event().wait(60)  # nothing sets it: the loop stays blocked

        asyncio.run(main())
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=os.environ
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == "blocking\n"
            process.send_signal(signal.SIGTERM)  # two at once would merge into one delivery
            assert process.stdout.readline() == "first\n"
            process.send_signal(signal.SIGTERM)
            assert process.wait(20) == EXIT_INTERRUPTED
        finally:
            process.kill()
