"""The pytest plugin of ``pipeline.testing``: fixtures for the stub worker and its clock.

Installed with the package (entry point ``pytest11``, name ``pipeline``), so a project's tests
use the fixtures without importing anything::

    def test_signup_flow(pipeline_stub, pipeline_clock):
        worker = pipeline_stub(app, fail_fast=True)
        signup.enqueue(email="a@b.c")
        report = worker.drain()

``-p no:pipeline`` turns it off.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

import pytest

from ._clock import FakeClock
from ._stub import StubWorker

if TYPE_CHECKING:
    from .._app import Pipeline

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


@pytest.fixture
def pipeline_clock() -> FakeClock:
    """A :class:`FakeClock` for this test (the one ``pipeline_stub``'s workers run on)."""
    return FakeClock()


@pytest.fixture
def pipeline_stub(pipeline_clock: FakeClock) -> Iterator[StubFactory]:
    """``pipeline_stub(app, fail_fast=True)``: a started :class:`StubWorker` for ``app`` on
    ``pipeline_clock`` (unless given another ``clock``); every application gets its own
    transport back when the test ends."""
    with contextlib.ExitStack() as stops:  # each is stopped, even when one's stop raises

        def start(
            app: Pipeline,
            *,
            fail_fast: bool = False,
            clock: FakeClock | None = None,
            rand: random.Random | None = None,
        ) -> StubWorker:
            on = clock if clock is not None else pipeline_clock
            worker = StubWorker(app, clock=on, fail_fast=fail_fast, rand=rand)
            worker.start()
            stops.callback(_stop, worker)
            return worker

        yield start


def _stop(worker: StubWorker) -> None:
    """Stop ``worker`` with its ``stop`` as the test left it (looked up at the end)."""
    worker.stop()
