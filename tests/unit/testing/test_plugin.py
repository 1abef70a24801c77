"""The pytest plugin: installed through the ``pytest11`` entry point, its fixtures are there
in a fresh pytest run of a project that imports nothing from it."""

from __future__ import annotations

import importlib
import importlib.util
import os
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import pipeline.testing.plugin
from pipeline.testing import FakeClock, StubWorker

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[3]

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


def _declared_plugin() -> str:
    """The module the package's ``pytest11`` entry point ``pipeline`` names (in pyproject.toml:
    the installed metadata is as old as the last install)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    entry: str = project["project"]["entry-points"]["pytest11"]["pipeline"]
    return entry


def test_the_entry_point_names_a_top_level_module_the_wheel_ships() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    name = _declared_plugin()
    assert "." not in name, "a project's own `pipeline` package would hide pipeline.something"
    assert f"libs/{name}" in project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    module = importlib.import_module(name)
    assert module.pipeline_stub is pipeline.testing.plugin.pipeline_stub
    assert module.StubFactory is pipeline.testing.plugin.StubFactory
    installed = [e for e in entry_points(group="pytest11") if e.name == "pipeline"]
    assert len(installed) == 1


SHADOWED_TEST = """
def test_of_the_project():
    assert 1 + 1 == 2

def test_with_a_fixture_of_the_plugin(pipeline_clock):
    pass
"""


def test_a_project_with_a_pipeline_package_of_its_own_still_runs_its_tests(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin was ``pipeline.testing.plugin``: with the project's own ``pipeline`` first on
    ``sys.path``, pytest stopped at start-up (``No module named 'pipeline.testing'``), no test
    ran."""
    # The entry point as pyproject.toml declares it, found before the installed one.
    dist = pytester.mkdir("site") / "kafka_pipeline-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kafka-pipeline\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(f"[pytest11]\npipeline = {_declared_plugin()}\n")
    found = importlib.util.find_spec(_declared_plugin())
    assert found is not None
    assert found.origin is not None
    where = Path(found.origin).parent.parent
    paths = [str(dist.parent), str(where), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    pytester.mkpydir("pipeline")  # the project's own, first on sys.path
    pytester.makepyfile(test_project=SHADOWED_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*pipeline.testing*hides kafka-pipeline's*-p no:pipeline*"])


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
