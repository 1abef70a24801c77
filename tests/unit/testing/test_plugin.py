"""The pytest plugin: installed through the ``pytest11`` entry point, its fixtures are there
in a fresh pytest run of a project that imports nothing from it."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

from pipeline.testing import FakeClock, StubWorker

pytest_plugins = ["pytester"]

PROJECT_TEST = """
from pipeline import Pipeline, Retry, Settings
from pipeline.testing import InMemoryTransport

app = Pipeline(Settings(namespace="plug"), transport=InMemoryTransport())
own = app._transport

@app.job("ping", max_attempts=3)
def ping(ctx) -> str:
    if ctx.attempt == 1:
        raise Retry(after=5)
    return "pong"

def test_a_flow_through_the_fixtures(pipeline_stub, pipeline_clock):
    start = pipeline_clock.now_ms()
    worker = pipeline_stub(app, fail_fast=True)
    assert worker.clock is pipeline_clock
    ping.enqueue()
    report = worker.drain()
    assert [r.value for r in report.succeeded] == ["pong"]
    assert pipeline_clock.now_ms() == start + 5_000

def test_the_transport_was_given_back():
    assert app._transport is own
"""


def test_the_entry_point_names_the_plugin_module() -> None:
    [entry] = [e for e in entry_points(group="pytest11") if e.name == "pipeline"]
    assert entry.value == "pipeline.testing.plugin"
    module = entry.load()
    assert module.__name__ == "pipeline.testing.plugin"


def test_a_fresh_pytest_run_gets_the_fixtures_from_the_installed_plugin(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_project=PROJECT_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_without_the_plugin_the_fixtures_are_missing(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_project=PROJECT_TEST)
    result = pytester.runpytest("-p", "no:pipeline", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*fixture 'pipeline_stub' not found*"])


def test_the_fixtures_in_this_run(pipeline_stub: object, pipeline_clock: FakeClock) -> None:
    from pipeline import Pipeline, Settings
    from pipeline.testing import InMemoryTransport

    app = Pipeline(Settings(namespace="here"), transport=InMemoryTransport())
    worker = pipeline_stub(app)  # type: ignore[operator]
    assert isinstance(worker, StubWorker)
    assert worker.clock is pipeline_clock
    assert app._transport is worker.transport


TEARDOWN_TEST = """
from pipeline import Pipeline, Settings
from pipeline.testing import InMemoryTransport

first = Pipeline(Settings(namespace="one"), transport=InMemoryTransport())
second = Pipeline(Settings(namespace="two"), transport=InMemoryTransport())
own = first._transport

def test_a_stub_whose_stop_fails(pipeline_stub):
    pipeline_stub(first)
    worker = pipeline_stub(second)

    def broken():
        raise RuntimeError("stop failed")

    worker.stop = broken

def test_the_other_application_got_its_transport_back():
    assert first._transport is own
"""


def test_every_stub_is_stopped_even_when_one_stop_fails(pytester: pytest.Pytester) -> None:
    """The stubs were stopped in a plain loop: one stop that raised left the applications of
    the others on the stub's transport, in every later test of the session."""
    pytester.makepyfile(test_teardown=TEARDOWN_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*RuntimeError: stop failed*"])
