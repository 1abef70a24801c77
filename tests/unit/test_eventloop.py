"""The worker's event loop ends without waiting for good for what its stop left behind: a
coroutine job that ignores its cancellation, a call of ``asyncio.to_thread`` that hangs. With
``asyncio.run`` the process stayed after a complete stop until it was killed, its exit code
lost."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
import warnings

import pytest

from pipeline._eventloop import BoundedRunner, DaemonThreads, run_loop


def test_a_task_that_ignores_its_cancellation_is_left_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = threading.Event()

    async def stubborn(running: asyncio.Event) -> None:
        started.set()
        running.set()
        while True:
            try:
                await asyncio.Event().wait()  # never set: it runs until cancelled
            except asyncio.CancelledError:
                continue

    async def main() -> int:
        running = asyncio.Event()
        asyncio.get_running_loop().create_task(stubborn(running), name="stubborn job")
        await running.wait()
        return 7

    returned: list[int] = []
    runner = threading.Thread(target=lambda: returned.append(run_loop(main())), daemon=True)
    runner.start()
    runner.join(30)
    assert returned == [7], "the loop waited for the task for good"
    assert started.is_set()
    assert "1 task(s) ignored their cancellation at exit" in caplog.text


def test_a_hanging_to_thread_call_does_not_hold_the_process_at_exit() -> None:
    """The standard default executor's threads are joined at interpreter exit, for good."""
    program = (
        "import asyncio, sys, threading\n"
        "from pipeline._eventloop import run_loop\n"
        "async def main():\n"
        "    calling = threading.Event()\n"
        "    def hangs():\n"
        "        calling.set()\n"
        "        threading.Event().wait()\n"
        "    asyncio.get_running_loop().run_in_executor(None, hangs)\n"
        "    calling.wait(10)\n"
        "    return 3\n"
        "sys.exit(run_loop(main()))\n"
    )
    ended = subprocess.run([sys.executable, "-c", program], timeout=60, check=False)
    assert ended.returncode == 3


def test_the_daemon_threads_run_calls_and_are_kept() -> None:
    pool = DaemonThreads(max_workers=2)

    def fails() -> None:
        raise ValueError("no")

    try:
        assert [pool.submit(pow, 2, n).result(10) for n in range(5)] == [1, 2, 4, 8, 16]
        with pytest.raises(ValueError, match="no"):
            pool.submit(fails).result(10)
        assert len(pool._daemons) == 1  # one call at a time: one thread, kept
        assert all(thread.daemon for thread in pool._daemons)
        release = threading.Event()
        blocked = [pool.submit(release.wait, 10) for _ in range(3)]
        assert len(pool._daemons) == 2  # no more than max_workers; the third call queues
        release.set()
        assert all(future.result(10) for future in blocked)
    finally:
        pool.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit(pow, 2, 2)


def test_a_runner_never_used_holds_no_loop_to_leak() -> None:
    # A stub worker started and never run made a loop that nothing closed: a ResourceWarning
    # (an unclosed event loop and its sockets) in whichever test the collector ran.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner = BoundedRunner()
        del runner
        gc.collect()
    assert [w.message for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_a_runner_runs_coroutines_in_turn_on_one_loop_until_closed() -> None:
    async def loop_of() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    with BoundedRunner() as runner:
        first, second = runner.run(loop_of()), runner.run(loop_of())
    assert first is second
    assert first.is_closed()
