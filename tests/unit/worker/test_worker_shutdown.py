"""A graceful stop has a budget: the final commit comes first, and every step after it (leaving
the group, the executors, the retry relay, the events stream, the heartbeats, the metrics
server, then the ``on_worker_stop`` hooks) gets what is left of the budget; one that hangs is
named in the log and left behind."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline import Pipeline, Settings
from pipeline._errors import NotAuthorizedError
from pipeline_worker import Middleware, _runtime
from pipeline_worker._runtime import Worker
from tests.waiting import wait_for

BUDGET_S = 0.5
"""The whole budget in these tests: no running jobs, no final commit time, this for the rest."""
NEVER_S = 30.0
"""How long the test waits for a worker that does not exit (it would hang for good)."""


class Steps:
    """What the worker's parts were asked, in order; ``hang`` names the one that never ends."""

    def __init__(self, hang: str) -> None:
        self.hang = hang
        self.done: list[str] = []
        self.released = threading.Event()
        """Set at the end of the test: the hung step returns (its thread ends)."""

    def step(self, name: str) -> None:
        if name == self.hang:
            self.released.wait()
        self.done.append(name)


class FakeConsumer:
    """The consumer thread: commits when asked to stop, then leaves the group (on its thread)."""

    def __init__(self, steps: Steps, side: Any, **_: Any) -> None:
        self.steps = steps
        self.side = side
        self.states: dict[tuple[str, int], Any] = {}
        self.done = threading.Event()
        self.intake_stopped = False
        self.started = threading.Event()
        self.health = SimpleNamespace(down=False)  # Kafka reachable

    @property
    def stop_requested(self) -> bool:
        return False

    @stop_requested.setter
    def stop_requested(self, value: bool) -> None:
        def finish() -> None:
            self.steps.step("final commit")
            self.steps.step("leaving the group")
            self.done.set()

        threading.Thread(target=finish, daemon=True).start()

    def start(self) -> None:
        self.started.set()
        if self.steps.hang == "the write check":  # the cluster refused: it stops, no job ran
            refused = NotAuthorizedError("topic", "ns.dlq", "WRITE", "alice", role="worker")
            self.side.loop.call_soon_threadsafe(self.side.on_consumer_failed, refused)
            threading.Thread(target=self.done.set, daemon=True).start()
        else:
            self.side.loop.call_soon_threadsafe(self.side.on_checked)  # its checks passed


class FakeProcessor:
    stopping = False
    in_flight = 0
    in_progress = 0
    finished = 0
    last_end = 0.0
    stuck = 0
    threads = 0

    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    def drop(self, states: Any) -> int:
        return 0

    async def wait_idle(self, states: Any, timeout: float) -> bool:
        return True

    async def close(self) -> None:
        if self.steps.hang == "executors":
            await asyncio.Event().wait()  # a job that ignores its cancellation, for good
        self.steps.done.append("executors")


class FakeRelay:
    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    def start(self) -> None:
        return None

    def stop(self, timeout: float) -> None:
        self.steps.step("retry relay")


class FakeEvents:
    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    def close(self, timeout: float = 5.0) -> None:
        self.steps.step("events stream")


class FakeBeats:
    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    async def run(self) -> None:
        await asyncio.Event().wait()

    def close(self) -> None:
        self.steps.step("heartbeats")


class Flusher(Middleware):
    """Flushes something at the end (to a collector that may never answer)."""

    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    def on_worker_stop(self, worker: Any) -> None:
        self.steps.step("Flusher.on_worker_stop")


class Closer(Flusher):
    def on_worker_stop(self, worker: Any) -> None:
        self.steps.step("Closer.on_worker_stop")


class Failing(Flusher):
    def on_worker_stop(self, worker: Any) -> None:
        self.steps.step("Failing.on_worker_stop")
        raise RuntimeError("the collector refused")


@pytest.fixture
def worker_with(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A worker whose parts are fakes, one of them hanging; the budget is BUDGET_S."""
    made: list[Steps] = []

    def make(hang: str, *middleware: type[Flusher]) -> tuple[Worker, Steps]:
        steps = Steps(hang)
        made.append(steps)
        processor = FakeProcessor(steps)
        fake_stages = type(
            "Stages",
            (),
            {
                "mover": None,
                "events": FakeEvents(steps),
                "store": None,
                "dedup": None,
                "processor": processor,
            },
        )
        monkeypatch.setattr(_runtime, "assemble", lambda *a, **k: fake_stages)
        monkeypatch.setattr(_runtime, "ConsumerThread", lambda **k: FakeConsumer(steps, **k))
        monkeypatch.setattr(_runtime, "RetryRelay", lambda *a: FakeRelay(steps))
        monkeypatch.setattr(_runtime, "heartbeats_of", lambda *a: FakeBeats(steps))
        monkeypatch.setattr(_runtime, "FINAL_COMMIT_S", 0.0, raising=False)
        monkeypatch.setattr(_runtime, "EXIT_S", BUDGET_S, raising=False)
        settings = Settings(namespace="ns", worker={"shutdown_timeout_s": 0})
        hooks = [kind(steps) for kind in middleware]
        return Worker(Pipeline(settings), middleware=hooks), steps

    yield make
    for steps in made:
        steps.released.set()


@pytest.mark.parametrize(
    "hang", ["leaving the group", "executors", "retry relay", "events stream", "heartbeats"]
)
def test_a_step_after_the_final_commit_that_hangs_does_not_keep_the_worker_from_exiting(
    worker_with: Any, hang: str, caplog: pytest.LogCaptureFixture
) -> None:
    worker, steps = worker_with(hang)
    codes: list[int] = []
    running = threading.Thread(target=lambda: codes.append(worker.run()), daemon=True)
    with caplog.at_level(logging.INFO, logger="pipeline.worker"):
        running.start()
        assert wait_for(lambda: worker._relay is not None, 10)
        worker.stop()
        running.join(NEVER_S)
        assert not running.is_alive(), f"the worker did not exit: {hang} hangs"
    assert codes == [0]
    assert steps.done[0] == "final commit", "offsets are committed first"
    assert hang not in steps.done
    messages = [r.getMessage() for r in caplog.records]
    [ran_out] = [m for m in messages if "did not finish within the shutdown budget" in m]
    assert hang in ran_out
    if hang != "leaving the group":  # the steps after it go side by side: the others finish
        after = {"executors", "retry relay", "events stream", "heartbeats"}
        assert set(steps.done) == {"final commit", "leaving the group"} | (after - {hang})


def test_a_worker_refused_at_its_write_check_starts_no_retry_relay(worker_with: Any) -> None:
    """The relay started beside the consumer thread, before its write check had passed: a
    refused worker's relay joined the retry tiers' group (and moved jobs) while it stopped."""
    worker, steps = worker_with("the write check")
    codes: list[int] = []
    running = threading.Thread(target=lambda: codes.append(worker.run()), daemon=True)
    running.start()
    running.join(NEVER_S)
    assert not running.is_alive(), "the worker did not exit"
    assert codes == [NotAuthorizedError.exit_code]
    assert "retry relay" not in steps.done, "no relay was started, so none was stopped"


def _run(worker: Worker) -> list[int]:
    """Run the worker, stop it, and wait for it to exit (or fail the test after NEVER_S)."""
    codes: list[int] = []
    running = threading.Thread(target=lambda: codes.append(worker.run()), daemon=True)
    running.start()
    assert wait_for(lambda: worker._relay is not None, 10)
    worker.stop()
    running.join(NEVER_S)
    assert not running.is_alive(), "the worker did not exit"
    return codes


def test_an_on_worker_stop_hook_that_hangs_is_named_and_left_behind(
    worker_with: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The hooks ran on the event loop after every bounded step, with no bound of their own:
    a flush that never returned kept the process up until the orchestrator killed it."""
    worker, steps = worker_with("Flusher.on_worker_stop", Flusher, Closer)
    with caplog.at_level(logging.INFO, logger="pipeline.worker"):
        assert _run(worker) == [0]
    assert "Flusher.on_worker_stop" not in steps.done
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert messages == [
        "stopping: Flusher.on_worker_stop did not finish within the shutdown budget; left behind",
        # The hooks keep their order: the next one is not started once the budget is spent.
        "stopping: Closer.on_worker_stop had no time left; not started",
    ]
    assert "Closer.on_worker_stop" not in steps.done


def test_on_worker_stop_hooks_run_in_order_after_the_stages_and_one_that_fails_is_counted(
    worker_with: Any, caplog: pytest.LogCaptureFixture
) -> None:
    worker, steps = worker_with("nothing", Failing, Closer)
    with caplog.at_level(logging.INFO, logger="pipeline.worker"):
        assert _run(worker) == [0]
    assert steps.done[-2:] == ["Failing.on_worker_stop", "Closer.on_worker_stop"]
    assert {"executors", "retry relay", "events stream", "heartbeats"} <= set(steps.done[:-2])
    assert worker.metrics.hook_failures == 1
    [failed] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert failed.getMessage() == "Failing.on_worker_stop failed"
    assert failed.exc_info is not None


class _AskedToStop:
    """A stage that records being asked to stop (``stop`` of the relay, ``close`` of the rest)."""

    def __init__(self) -> None:
        self.asked = threading.Event()

    def stop(self, timeout: float) -> None:
        self.asked.set()

    def close(self, *args: object) -> None:
        self.asked.set()


async def _no_close() -> None:
    return None


def test_the_stages_are_asked_to_stop_even_once_the_budget_is_spent() -> None:
    """The final commit may take the whole budget: the retry relay, the metrics server, the
    heartbeats and the events must still be told to stop (an embedded worker's process goes on
    after ``run`` returns, and the relay would keep relaying)."""
    from pipeline_worker._signals import StopBudget
    from pipeline_worker._stopping import close_stages

    now = [0.0]
    budget = StopBudget(1.0, clock=lambda: now[0])
    now[0] = 2.0  # spent
    relay, server, beats, events = _AskedToStop(), _AskedToStop(), _AskedToStop(), _AskedToStop()
    processor = type("Closed", (), {"close": staticmethod(_no_close)})()
    asyncio.run(
        close_stages(
            budget,
            processor,
            beats=beats,  # type: ignore[arg-type]
            relay=relay,  # type: ignore[arg-type]
            refused=False,
            events=events,  # type: ignore[arg-type]
            server=server,  # type: ignore[arg-type]
        )
    )
    for stage in (relay, server, beats, events):
        assert stage.asked.wait(5)


def test_the_executors_are_stopped_even_once_the_budget_is_spent() -> None:
    """Their close is awaited with no time left: it must still run its first step (the pool
    told to stop, the runners cancelled), or an embedded worker's pool threads stay."""
    from pipeline.testing import InMemoryTransport
    from pipeline_worker._signals import StopBudget
    from pipeline_worker._stopping import close_stages

    from .support import Harness

    async def main() -> list[threading.Thread]:
        app = Pipeline(transport=InMemoryTransport())

        @app.job("plain")
        def plain(i: int) -> None:
            return None

        before = set(threading.enumerate())  # other tests' threads are not this pool's
        h = Harness(app, concurrency=4, threads=2)
        h.feed(h.message("plain", {"i": 0}))
        await h.recorder.wait_for(1)
        threads = [
            t for t in set(threading.enumerate()) - before if t.name.startswith("pipeline-pool-")
        ]
        assert threads
        now = [0.0]
        budget = StopBudget(1.0, clock=lambda: now[0])
        now[0] = 2.0  # spent: the final commit took it all
        await close_stages(
            budget, h.processor, beats=None, relay=None, refused=False, events=None, server=None
        )
        return threads

    for thread in asyncio.run(main()):
        thread.join(10)
        assert not thread.is_alive(), f"{thread.name} was never told to stop"


def test_a_step_started_with_no_time_left_is_logged_as_not_waited_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It is started (a stage asked to stop must be told), then not waited for: the line said
    "left behind" as for one that hung, also when it ended at once."""
    from pipeline_worker._signals import StopBudget

    now = [0.0]
    budget = StopBudget(1.0, clock=lambda: now[0])
    now[0] = 2.0  # spent
    ran, release = threading.Event(), threading.Event()

    def step() -> None:
        ran.set()
        release.wait(NEVER_S)  # returns once the call has given up on it

    with caplog.at_level(logging.ERROR, logger="pipeline.worker"):
        waited = asyncio.run(budget.call("the retry relay", step))
    release.set()
    assert ran.wait(NEVER_S)
    assert waited is False
    assert [r.getMessage() for r in caplog.records] == [
        "stopping: the retry relay had no time left; started, not waited for"
    ]


@pytest.mark.parametrize("down", [True, False], ids=["kafka-unreachable", "kafka-reachable"])
def test_a_consumer_closing_while_kafka_is_unreachable_is_waited_for_briefly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, down: bool
) -> None:
    """librdkafka's close waits for a group coordinator that does not answer: a SIGTERM during
    an outage took the whole 45 s budget, past Kubernetes' default grace period of 30 s."""
    from pipeline_worker import _stopping
    from pipeline_worker._signals import StopBudget

    monkeypatch.setattr(_stopping, "UNREACHABLE_CLOSE_S", 0.05)
    closing = SimpleNamespace(
        stop_requested=False,
        intake_stopped=False,
        done=threading.Event(),  # never set: the close goes on
        health=SimpleNamespace(down=down),
    )
    idle = SimpleNamespace(stopping=False, in_progress=0, drop=lambda states: 0)
    budget = StopBudget(NEVER_S if down else 0.3)
    with caplog.at_level(logging.ERROR, logger="pipeline.worker"):
        asyncio.run(_stopping.drain(budget, idle, closing, [], 1.0))  # type: ignore[arg-type]
    assert closing.stop_requested
    if down:
        assert budget.left() > NEVER_S - 5  # not the whole budget
    else:
        assert budget.left() == 0  # reachable: the close may use all of it
    assert "the consumer (final commit, leaving the group) did not finish" in caplog.text
