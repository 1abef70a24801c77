"""The pytest plugin of ``pipeline.testing``: fixtures for the stub worker and its clock.

Installed with the package (entry point ``pytest11``, name ``pipeline``), so a project's tests
use the fixtures without importing anything::

    def test_signup_flow(pipeline_stub, pipeline_clock):
        worker = pipeline_stub(app, fail_fast=True)
        signup.enqueue(email="a@b.c")
        report = worker.drain()

``-p no:pipeline`` turns it off.

pytest loads this module in every run of every project that installed the package, before any
test, so it has a top-level name of its own and imports ``pipeline`` only when a fixture is
used: a project with a ``pipeline`` package of its own (which hides this one) still starts,
and only a test that asks for one of these fixtures fails, saying why.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

import pytest

if TYPE_CHECKING:
    import random

    from pipeline import Pipeline
    from pipeline.testing import FakeClock, StubWorker

__all__ = ["StubFactory", "pipeline_clock", "pipeline_stub"]


class StubFactory(Protocol):
    """What the ``pipeline_stub`` fixture is: call it to start a stub worker for ``app``."""

    def __call__(
        self,
        app: Pipeline,
        *,
        fail_fast: bool = False,
        clock: FakeClock | None = None,
        rand: random.Random | None = None,
    ) -> StubWorker: ...


def _kit() -> ModuleType:
    """``pipeline.testing``; a test that needs it fails, saying why, when it is not there."""
    try:
        import pipeline.testing as kit
    except ImportError as exc:
        found = sys.modules.get("pipeline")
        where = getattr(found, "__file__", None) or list(getattr(found, "__path__", []))
        pytest.fail(
            f"the fixtures of the pytest plugin 'pipeline' (kafka-pipeline's test kit) need "
            f"pipeline.testing, which does not import here ({exc}; `pipeline` is {where}): a "
            f"project's own top-level `pipeline` package hides kafka-pipeline's. Rename it, or "
            f"run pytest with `-p no:pipeline`",
            pytrace=False,
        )
    return kit


@pytest.fixture
def pipeline_clock() -> FakeClock:
    """A :class:`FakeClock` for this test (the one ``pipeline_stub``'s workers run on)."""
    clock: FakeClock = _kit().FakeClock()
    return clock


@pytest.fixture
def pipeline_stub(pipeline_clock: FakeClock) -> Iterator[StubFactory]:
    """``pipeline_stub(app, fail_fast=True)``: a started :class:`StubWorker` for ``app`` on
    ``pipeline_clock`` (unless given another ``clock``); every application gets its own
    transport back when the test ends."""
    kit = _kit()
    with contextlib.ExitStack() as stops:  # each is stopped, even when one's stop raises

        def start(
            app: Pipeline,
            *,
            fail_fast: bool = False,
            clock: FakeClock | None = None,
            rand: random.Random | None = None,
        ) -> StubWorker:
            on = clock if clock is not None else pipeline_clock
            worker: StubWorker = kit.StubWorker(app, clock=on, fail_fast=fail_fast, rand=rand)
            worker.start()
            stops.callback(_stop, worker)
            return worker

        yield start


def _stop(worker: StubWorker) -> None:
    """Stop ``worker`` with its ``stop`` as the test left it (looked up at the end)."""
    worker.stop()
