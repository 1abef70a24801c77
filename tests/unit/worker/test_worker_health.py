"""What a worker process tells its orchestrator: ``/healthz`` while it reads back newly assigned
partitions (reading their commit marks holds the consumer thread's polls for up to its own
timeout, which is no stuck consumer; their idempotency keys are restored on a helper thread,
polls going on), its exit code."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from pipeline import Pipeline, Settings
from pipeline_worker._runtime import Worker

from .test_worker_consumer import consumer_thread, loop

__all__ = ["loop"]  # the fixture


def worker_whose_consumer(*, silent_s: float, reading_back: bool, owned: int = 2) -> Worker:
    worker = Worker(Pipeline(Settings(namespace="ns", worker={"dedup_restore_timeout_s": 120})))
    worker._stopped = asyncio.Event()
    worker._consumer = SimpleNamespace(  # type: ignore[assignment]
        done=threading.Event(),
        last_poll=time.monotonic() - silent_s,
        reading_back=reading_back,
        states={("ns.jobs.default", p): None for p in range(owned)},
    )
    return worker


@pytest.mark.parametrize(
    ("silent_s", "reading_back", "healthy"),
    [
        (10, False, True),
        (60, False, False),  # no poll for a minute: stuck
        (20, True, True),  # reading commit marks (up to READ_MARKS_S)
        # then the watermarks of partitions whose owner died, one after another (up to
        # WATERMARKS_TIMEOUT_S each: two partitions here)
        (40, True, True),
        (60, True, False),  # past those reads' own timeouts: stuck all the same; a restore of
        # keys, however long, does not hold the polls
    ],
)
def test_a_consumer_reading_back_marks_is_healthy_until_the_read_times_out(
    silent_s: float, reading_back: bool, healthy: bool
) -> None:
    ok, why = worker_whose_consumer(silent_s=silent_s, reading_back=reading_back).healthy()
    assert ok is healthy, why
    if not healthy:
        assert "has not polled" in why


def test_the_consumer_thread_says_it_reads_back_while_it_does(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, _, _ = consumer_thread(loop)
    seen: list[bool] = []

    def load(*, resume: bool) -> list[object]:
        seen.append(thread.reading_back)
        return []

    thread.assignment = SimpleNamespace(due=lambda: True, load=load)  # type: ignore[assignment]
    thread._chores(time.monotonic(), idle=True)
    assert seen == [True]
    assert not thread.reading_back


def test_a_failure_s_exit_code_stands_against_a_burst_s_end() -> None:
    """The retry relay failed (exit code 1) while the burst's end (0) was on its way: the
    worker exited 0 after a failure."""
    worker = worker_whose_consumer(silent_s=0, reading_back=False)
    worker._fail(1)
    worker._fail(0)
    assert worker._exit_code == 1


def test_kafka_unreachable_fails_healthz_and_not_livez() -> None:
    """A restart does not bring Kafka back: restarted by its liveness probe in an outage, a
    worker lost the outcomes it held for Kafka's return (their jobs ran again)."""
    worker = worker_whose_consumer(silent_s=1, reading_back=False)
    worker.health = SimpleNamespace(  # type: ignore[assignment]
        unreachable_for=lambda: 3600.0, describe=lambda: "Kafka at k:9092 unreachable for 1h"
    )
    assert worker.healthy() == (False, "Kafka at k:9092 unreachable for 1h")
    assert worker.live() == (True, "ok")
    stuck = worker_whose_consumer(silent_s=600, reading_back=False)
    assert stuck.live()[0] is False
    assert stuck.healthy()[0] is False
