"""A lock another thread of the parent holds at ``os.fork()`` is not held in the child.

A thread serving a producer's error callback during an outage holds the broker health
tracker's lock for a moment; a fork at that moment left the lock held for good in the child,
whose next callback (its exit flush's included) then waited for ever. The child re-creates the
locks of the broker health trackers and of the exit flush.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from confluent_kafka import KafkaError

from pipeline import _exitflush
from pipeline._brokerhealth import BrokerHealth

BOUND_S = 20.0
"""How long a child may take for what takes it milliseconds."""
SERVERS = "127.0.0.1:1"


def _child_finishes(lock: AbstractContextManager[Any], work: Callable[[], None]) -> bool:
    """Fork while another thread holds ``lock``; whether the child did ``work`` in time."""
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            held.set()
            release.wait(BOUND_S)

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    assert held.wait(BOUND_S)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 1
        try:
            os.close(read_end)
            work()
            os.write(write_end, b"done")
            code = 0
        finally:
            os._exit(code)
    release.set()
    thread.join(BOUND_S)
    os.close(write_end)
    finished = False
    try:
        poller = select.poll()  # not select(): this process may hold descriptors past 1023
        poller.register(read_end, select.POLLIN)
        ready = poller.poll(BOUND_S * 1000)
        finished = bool(ready) and os.read(read_end, 4) == b"done"
    finally:
        os.close(read_end)
        if not finished:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return finished


def _tracker() -> BrokerHealth:
    return BrokerHealth.of(SERVERS)


def _outage_callbacks() -> None:
    """What a producer's callbacks do in an outage, each under the tracker's locks."""
    tracker = _tracker()
    tracker.on_error("producer", KafkaError(KafkaError._TRANSPORT, "Connection refused"))
    tracker.on_error("producer", KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers down"))
    tracker.on_error("producer", KafkaError(KafkaError._FAIL, "something else"))  # rate-limited
    assert tracker.unreachable_for() is not None


@pytest.mark.parametrize(
    ("lock", "work"),
    [
        (lambda: _tracker()._lock, _outage_callbacks),
        (lambda: _tracker()._lines._lock, _outage_callbacks),
        (lambda: BrokerHealth._trackers_lock, lambda: BrokerHealth.of("127.0.0.1:2")),
        (lambda: _exitflush._lock, lambda: _exitflush.unwatch(object())),  # type: ignore[arg-type]
    ],
    ids=["tracker", "tracker-log-lines", "tracker-registry", "exit-flush"],
)
def test_a_forked_child_does_not_wait_for_a_lock_a_parent_thread_held(
    lock: Callable[[], AbstractContextManager[Any]], work: Callable[[], None]
) -> None:
    assert _child_finishes(lock(), work)


def test_a_forked_child_starts_its_trackers_afresh() -> None:
    """The parent's clients, whose word the trackers hold, are not the child's: an outage the
    parent saw, and the clients it watched, are none of the child's (the same objects, which
    the parent's transports hold)."""
    tracker = _tracker()
    tracker.callbacks("consumer", stats=True)
    tracker.on_error("consumer", KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers down"))
    assert tracker.down

    def fresh() -> None:
        assert BrokerHealth.of(SERVERS) is tracker
        assert not tracker.down
        assert tracker.unreachable_for() is None
        # The child's producer is heard, though it is not the parent's watching consumer.
        tracker.on_error("producer", KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers down"))
        assert tracker.down

    try:
        assert _child_finishes(threading.Lock(), fresh)
        assert tracker.down, "the parent's tracker is left as it was"
    finally:
        tracker._start_afresh()


# The reviewer's scenario: a parent thread holds the tracker's lock when the process forks; the
# child enqueues against an address where no broker listens and exits normally, so the exit
# flush (bounded by 0.5 s) runs its producer's callbacks. The child hung there.
HELD_AT_FORK = f"""
    import os, select, sys, threading
    from pipeline import Pipeline
    from pipeline._brokerhealth import BrokerHealth

    app = Pipeline(bootstrap_servers={SERVERS!r}, producer={{"exit_flush_timeout_s": 0.5}})
    held, release = threading.Event(), threading.Event()

    def holder():
        with BrokerHealth.of({SERVERS!r})._lock:
            held.set()
            release.wait(60)

    threading.Thread(target=holder, daemon=True).start()
    held.wait(60)
    pid = os.fork()
    if pid == 0:
        print(app.enqueue("report.build", {{"n": 1}}), flush=True)
        sys.exit(0)
    release.set()
    ended, _, _ = select.select([os.pidfd_open(pid)], [], [], {BOUND_S})
    if not ended:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        sys.exit("the child hung")
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_forked_childs_exit_flush_ends_though_a_parent_thread_held_the_lock() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(HELD_AT_FORK)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    [job_id] = result.stdout.split()
    [report] = [line for line in result.stderr.splitlines() if "never reached Kafka" in line]
    assert report.startswith(f"1 enqueued job(s) never reached Kafka at {SERVERS}")
    assert job_id in report
