"""The log formats: ``text`` (key=value) and ``json`` (one object per line)."""

from __future__ import annotations

import json
import logging

import pytest

from pipeline import ConfigurationError, Pipeline, Settings
from pipeline._logfmt import JsonFormatter, KeyValueFormatter, configure_logging


def record(exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    entry = logging.LogRecord(
        "pipeline.worker", logging.WARNING, __file__, 1, "job %s failed", ("j1",), exc_info
    )
    entry.job_id = "j1"
    entry.partition = 3
    entry.note = 'a "quoted"\nvalue'
    return entry


def failed() -> ValueError:
    try:
        raise ValueError("the payload was odd")
    except ValueError as exc:
        return exc


def test_a_json_line_holds_the_message_the_extra_fields_and_the_traceback() -> None:
    line = JsonFormatter().format(record(failed()))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "pipeline.worker"
    assert entry["message"] == "job j1 failed"
    assert entry["job_id"] == "j1"
    assert entry["partition"] == 3
    assert entry["note"] == 'a "quoted"\nvalue'
    assert entry["time"].endswith("Z")
    assert entry["exception"].startswith("Traceback (most recent call last):")
    assert entry["exception"].rstrip().endswith("ValueError: the payload was odd")


def test_an_extra_field_never_replaces_a_standard_one() -> None:
    entry = record()
    entry.level = "custom"  # extra={"level": ...} is allowed: LogRecord has levelname, not level
    parsed = json.loads(JsonFormatter().format(entry))
    assert parsed["level"] == "WARNING"
    assert parsed["level_"] == "custom"


def test_a_value_json_cannot_write_is_written_as_its_text() -> None:
    entry = record()
    entry.where = {"topic", "x"} - {"x"}  # a set: not JSON
    assert json.loads(JsonFormatter().format(entry))["where"] == "{'topic'}"


def test_the_text_format_keeps_key_value_pairs() -> None:
    line = KeyValueFormatter().format(record())
    assert line.endswith('job j1 failed job_id=j1 partition=3 note="a \\"quoted\\"\\nvalue"')


@pytest.mark.parametrize(
    ("env", "given", "formatter"),
    [
        (None, None, KeyValueFormatter),
        ("json", None, JsonFormatter),
        ("JSON", None, JsonFormatter),
        ("json", "text", KeyValueFormatter),
        (None, "json", JsonFormatter),
    ],
)
def test_configure_logging_takes_the_format_given_else_the_environment(
    monkeypatch: pytest.MonkeyPatch, env: str | None, given: str | None, formatter: type
) -> None:
    if env is None:
        monkeypatch.delenv("PIPELINE_LOG_FORMAT", raising=False)
    else:
        monkeypatch.setenv("PIPELINE_LOG_FORMAT", env)
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    try:
        configure_logging("INFO", given)  # type: ignore[arg-type]
        [handler] = root.handlers
        assert type(handler.formatter) is formatter
    finally:
        root.handlers[:] = saved
        root.setLevel(level)


def test_an_unknown_log_format_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_LOG_FORMAT", "xml")
    with pytest.raises(ConfigurationError, match="log_format"):
        Pipeline()
    monkeypatch.setenv("PIPELINE_LOG_FORMAT", "json")
    assert Settings().log_format == "json"
