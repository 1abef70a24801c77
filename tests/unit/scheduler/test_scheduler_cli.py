"""``pipeline-scheduler``'s arguments: wrong ones exit 2 and say what is wrong, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline_scheduler._cli import main


@pytest.mark.parametrize("via", ["option", "environment"])
def test_a_config_file_that_is_not_toml_is_a_usage_error_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("namespace = [\n")
    monkeypatch.delenv("PIPELINE_CONFIG_FILE", raising=False)
    args: list[str] = []
    env: dict[str, str] = {}
    if via == "option":
        args = ["--config", str(bad)]
    else:
        env["PIPELINE_CONFIG_FILE"] = str(bad)
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 2, result.output
    assert f"config file {bad}" in result.output
    assert "cannot be read as TOML" in result.output
    assert isinstance(result.exception, SystemExit)


def test_a_config_file_named_by_the_environment_that_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    result = CliRunner().invoke(main, [], env={"PIPELINE_CONFIG_FILE": str(missing)})
    assert result.exit_code == 2, result.output
    assert f"config file {missing} (PIPELINE_CONFIG_FILE) does not exist" in result.output
    assert isinstance(result.exception, SystemExit)
