"""``pipeline-worker``'s arguments: wrong ones exit non-zero and say what is wrong."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from pipeline import Pipeline, Settings
from pipeline._loader import AppLoadError, load_app
from pipeline_worker._cli import WORKER_OPTIONS, _settings
from pipeline_worker._cli import command as main
from pipeline_worker._supervisor import child_arguments

APP_MODULE = """
from pipeline import Pipeline, Settings

app = Pipeline(Settings(namespace="fromapp", bootstrap_servers="app:9092"))
other = Pipeline(Settings(namespace="other"))
not_an_app = 42

@app.job("noop")
async def noop() -> None:
    return None
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project directory with ``workerapp.py``, as the current directory."""
    name = f"workerapp_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(APP_MODULE)
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path / name
    for module in (name, "broken"):
        sys.modules.pop(module, None)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--app", "x", "--weights", "1,2"], "give 4 positive integers"),
        (["--app", "x", "--weights", "a,b,c,d"], "not a comma-separated list of integers"),
        (["--app", "x", "--weights", "1,0,1,1"], "give 4 positive integers"),
        (["--app", "x", "--priorities", "urgent"], "unknown priority 'urgent'"),
        (["--app", "x", "--priorities", "low,low"], "repeated"),
        (["--app", "x", "--policy", "fifo"], "'fifo' is not one of"),
        (["--app", "x", "--concurrency", "0"], "0 is not in the range x>=1"),
        (["--app", "x", "--metrics-port", "70000"], "70000 is not in the range"),
        (["--app", "x", "--config", "/nonexistent/worker.toml"], "does not exist"),
        # The default group instead: another group's partitions, its jobs run twice.
        (["--app", "x", "--group", ""], "Invalid value for '--group': must not be empty"),
        (["--concurrency", "5"], "Missing option '--app'"),
        (["--app", "x", "--bogus"], "No such option '--bogus'"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args: list[str], message: str) -> None:
    code, output = invoke(*args)
    assert code == 2
    assert message in output


def test_an_app_module_that_does_not_exist(project: Path) -> None:
    code, output = invoke("--app", "no_such_module_here:app")
    assert code == 2
    assert "cannot import module 'no_such_module_here'" in output


def test_an_app_attribute_that_does_not_exist(project: Path) -> None:
    code, output = invoke("--app", f"{project.name}:missing")
    assert code == 2
    assert "has no attribute 'missing'" in output


def test_an_app_attribute_that_is_not_a_pipeline(project: Path) -> None:
    code, output = invoke("--app", f"{project.name}:not_an_app")
    assert code == 2
    assert "is a int, not a pipeline.Pipeline" in output


def test_an_app_module_that_fails_to_import_shows_why(project: Path) -> None:
    code, output = invoke("--app", "broken")
    assert code == 2
    assert "boom at import" in output


def test_a_malformed_app_spec(project: Path) -> None:
    code, output = invoke("--app", "not a module")
    assert code == 2
    assert "is not MODULE[:ATTR]" in output


def test_the_current_directory_is_importable_and_attr_defaults_to_app(project: Path) -> None:
    app = load_app(project.name)
    assert isinstance(app, Pipeline)
    assert app.settings.namespace == "fromapp"
    assert load_app(f"{project.name}:other").settings.namespace == "other"
    with pytest.raises(AppLoadError):
        load_app(f"{project.name}:noop.nothing")


def test_flags_override_the_application_settings() -> None:
    app = Pipeline(
        Settings(namespace="fromapp", bootstrap_servers="app:9092", worker={"concurrency": 7})
    )
    options: dict[str, Any] = dict.fromkeys(WORKER_OPTIONS)
    options.update(concurrency=200, priorities=["low", "critical"], key_ordering=True)
    settings = _settings(app, "cli:9092", None, options)
    assert settings.bootstrap_servers == "cli:9092"
    assert settings.namespace == "fromapp"
    assert settings.worker.concurrency == 200
    assert [p.value for p in settings.worker.priorities] == ["low", "critical"]
    assert settings.worker.key_ordering is True
    unchanged = _settings(app, None, None, dict.fromkeys(WORKER_OPTIONS))
    assert unchanged.worker.concurrency == 7
    with pytest.raises(click.UsageError, match="namespace"):
        _settings(app, None, "bad namespace!", dict.fromkeys(WORKER_OPTIONS))


def test_an_invalid_option_value_is_named_by_its_option_not_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The option wins over the variable: the variable, set and valid, was blamed."""
    monkeypatch.setenv("PIPELINE_NAMESPACE", "fine")
    monkeypatch.setenv("PIPELINE_WORKER__CONCURRENCY", "8")
    app = Pipeline(Settings())
    options: dict[str, Any] = dict.fromkeys(WORKER_OPTIONS)
    with pytest.raises(click.UsageError) as raised:
        _settings(app, None, "bad namespace!", options)
    assert "invalid settings: namespace (option --namespace): " in str(raised.value)
    assert "PIPELINE_NAMESPACE" not in str(raised.value)
    options.update(concurrency=0, group_id="workers")  # as if click had let 0 through
    with pytest.raises(click.UsageError) as raised:
        _settings(app, None, None, options)
    assert "invalid settings: worker.concurrency (option --concurrency): " in str(raised.value)
    assert "PIPELINE_WORKER__CONCURRENCY" not in str(raised.value)


def test_children_get_the_parents_options() -> None:
    args = child_arguments(
        {
            "app_spec": "m:app",
            "priorities": ["high", "low"],
            "weights": [1, 2, 3, 4],
            "burst": True,
            "key_ordering": False,
            "concurrency": 9,
            "group_id": None,
        }
    )
    assert args == [
        "--app", "m:app", "--priorities", "high,low", "--weights", "1,2,3,4",
        "--concurrency", "9", "--burst", "--no-key-ordering",
    ]  # fmt: skip


SLOW_APP = """
import sys
from pipeline import Pipeline

print("importing", flush=True)
sys.stdin.readline()  # the test stops us here, in the middle of start-up
app = Pipeline()
"""


def test_a_stop_signal_during_start_up_exits_cleanly(tmp_path: Path) -> None:
    (tmp_path / "slowapp.py").write_text(SLOW_APP)
    with subprocess.Popen(
        [sys.executable, "-m", "pipeline_worker", "--app", "slowapp"],
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PIPELINE_BOOTSTRAP_SERVERS": "127.0.0.1:9"},
    ) as child:
        assert child.stdout is not None
        assert child.stdin is not None
        assert child.stdout.readline() == b"importing\n"
        child.send_signal(signal.SIGTERM)
        child.stdin.close()
        output = child.stdout.read().decode()
        assert child.wait(30) == 0, output
    assert "stopped before starting" in output


def test_weights_with_the_strict_policy_are_kept_for_the_jobs_waiting_for_a_limit() -> None:
    from pipeline import Pipeline
    from pipeline_worker._cli import _settings

    options = {"policy": "strict", "weights": [1, 2, 3, 4]}
    worker = _settings(Pipeline(), None, None, options).worker
    assert (worker.policy, worker.weights) == ("strict", [1, 2, 3, 4])


def test_metrics_ports_past_65535_are_refused_by_the_supervisor(project: Path) -> None:
    """Process k serves port + k: the last would fail its own check with a port no one gave,
    exit 2 and stay down without a word, the others running on. The check is the
    supervisor's: a child, given its own port, sees the same number of processes."""
    code, output = invoke("--app", project.name, "--processes", "2", "--metrics-port", "65535")
    assert code == 2
    assert "up to 65536, past 65535" in output
