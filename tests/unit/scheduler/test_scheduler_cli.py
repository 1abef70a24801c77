"""``pipeline-scheduler``'s arguments: wrong ones exit 2 and say what is wrong, no traceback.

A config file it cannot read is tested with the worker's in ``tests/unit/test_cliargs.py``,
a setting it does not use in ``tests/unit/test_settings.py``."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pipeline_scheduler._cli import main


def test_an_empty_app_is_refused_not_taken_as_none() -> None:
    # `--app "$UNSET"` ran the scheduler without the application's schedules.
    result = CliRunner().invoke(main, ["--app", ""])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--app': must not be empty" in result.output


@pytest.mark.parametrize(
    ("option", "value", "setting", "fine"),
    [
        ("--namespace", "bad namespace!", "namespace", "fine"),
        ("--bootstrap-servers", " , ", "bootstrap_servers", "fine:9092"),
    ],
)
def test_an_invalid_option_value_is_named_by_its_option_not_the_variable(
    option: str, value: str, setting: str, fine: str
) -> None:
    """The option wins over the variable: the variable, set and valid, was blamed."""
    variable = "PIPELINE_" + setting.upper()
    result = CliRunner().invoke(main, [option, value], env={variable: fine})
    assert result.exit_code == 2, result.output
    assert f"invalid settings: {setting} (option {option}): " in result.output
    assert variable not in result.output
    assert isinstance(result.exception, SystemExit)
