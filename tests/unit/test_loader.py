"""``--app`` of the services: one loader, the same errors for the worker and the scheduler."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pipeline import Pipeline
from pipeline._loader import load_app_for_service
from pipeline_scheduler._cli import main as scheduler
from pipeline_worker._cli import command as worker


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A project directory with a good and a broken application module, as the current one."""
    name = f"loaderapp_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("from pipeline import Pipeline\napp = Pipeline()\n")
    (tmp_path / f"{name}_broken.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield name
    for module in (name, f"{name}_broken"):
        sys.modules.pop(module, None)


def test_a_good_spec_gives_the_application(project: str) -> None:
    assert isinstance(load_app_for_service(project), Pipeline)


def test_a_spec_that_names_no_application_is_a_usage_error(project: str) -> None:
    with pytest.raises(click.BadParameter, match="has no attribute 'missing'"):
        load_app_for_service(f"{project}:missing")


@pytest.mark.parametrize("command", [worker, scheduler], ids=["worker", "scheduler"])
def test_both_services_report_a_failing_import_the_same_way(
    project: str, command: click.Command
) -> None:
    result = CliRunner().invoke(command, ["--app", f"{project}_broken"])
    assert result.exit_code == 2
    assert f"importing the application '{project}_broken' failed" in result.output
    assert "RuntimeError: boom at import" in result.output
