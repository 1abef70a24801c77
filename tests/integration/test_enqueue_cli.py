"""``pipeline enqueue`` with ``--app``: the type's options, checked payloads, payload files."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline import Settings
from pipeline._admin import apply_topics
from pipeline._codec import JobCodec
from pipeline_cli import cli

from .test_enqueue import read_all

pytestmark = pytest.mark.kafka

APP_MODULE = """
from pipeline import Pipeline

app = Pipeline()


@app.job("report.build", priority="high", max_attempts=2)
def build(report_id: int, fmt: str = "pdf") -> None: ...
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An application module in the current directory; its name."""
    name = f"cliapp_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(APP_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield name
    sys.modules.pop(name, None)


def _enqueue(settings: Settings, *args: str, stdin: str | None = None) -> tuple[int, str]:
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--namespace", settings.namespace]
    result = CliRunner().invoke(cli, ["enqueue", *args, *common, "--json"], input=stdin)
    return result.exit_code, result.output


def test_the_types_declared_options_are_the_defaults(settings: Settings, module: str) -> None:
    apply_topics(settings)
    code, output = _enqueue(
        settings, "report.build", "--app", f"{module}:app", "--payload", '{"report_id": 7}'
    )
    assert code == 0, output
    printed = json.loads(output)
    [message] = read_all(settings.bootstrap_servers, f"{settings.namespace}.jobs.high", 1)
    job = JobCodec().decode(message.value() or b"")
    assert (job.id, job.priority.value, job.max_attempts) == (printed["id"], "high", 2)

    code, output = _enqueue(
        settings,
        "report.build",
        "--app",
        module,
        "--payload",
        '{"report_id": 8}',
        "--priority",
        "low",
        "--max-attempts",
        "9",
    )
    assert code == 0, output
    [message] = read_all(settings.bootstrap_servers, f"{settings.namespace}.jobs.low", 1)
    job = JobCodec().decode(message.value() or b"")
    assert (job.priority.value, job.max_attempts) == ("low", 9), "explicit options win"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no.such.type", "--payload", "{}"], "has no job type 'no.such.type'"),
        (["report.build", "--payload", '{"report_id": "seven"}'], "report_id: Input should be"),
        (["report.build", "--payload", '{"fmt": "csv"}'], "report_id"),
        (["report.build", "--payload", '{"report_id": 1, "x": 2}'], "unexpected"),
    ],
)
def test_a_bad_type_or_payload_exits_2_and_sends_nothing(
    settings: Settings, module: str, args: list[str], message: str
) -> None:
    apply_topics(settings)
    code, output = _enqueue(settings, *args, "--app", module)
    assert code == 2, output
    assert message in output
    assert "Traceback" not in output
    # A job of the type would go to its priority's topic.
    assert read_all(settings.bootstrap_servers, f"{settings.namespace}.jobs.high", 1, 3) == []


def test_a_payload_from_a_file_or_stdin(settings: Settings, tmp_path: Path) -> None:
    apply_topics(settings)
    big = {"text": "x" * 300_000}  # more than a command line may carry (ARG_MAX per string)
    (tmp_path / "payload.json").write_text(json.dumps(big))
    code, output = _enqueue(settings, "t", "--payload", f"@{tmp_path / 'payload.json'}")
    assert code == 0, output
    code, output = _enqueue(settings, "t", "--payload", "-", stdin='{"n": 1}')
    assert code == 0, output
    messages = read_all(settings.bootstrap_servers, f"{settings.namespace}.jobs.default", 2)
    payloads = sorted(
        (json.loads(JobCodec().decode(m.value() or b"").payload) for m in messages),
        key=lambda payload: len(json.dumps(payload)),
    )
    assert payloads == [{"n": 1}, big]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("@/no/such/file.json", "cannot read /no/such/file.json"),
        ("-", "standard input is not valid JSON"),
    ],
)
def test_an_unreadable_payload_source_is_a_usage_error(payload: str, message: str) -> None:
    result = CliRunner().invoke(cli, ["enqueue", "t", "--payload", payload], input="{oops")
    assert result.exit_code == 2
    assert message in result.output


def test_an_invalid_setting_is_one_line_and_exit_2() -> None:
    result = CliRunner().invoke(cli, ["enqueue", "t"], env={"PIPELINE_PRODUCER__LINGER_MS": "soon"})
    assert result.exit_code == 2
    assert "producer.linger_ms (environment variable PIPELINE_PRODUCER__LINGER_MS)" in result.output
    assert "Traceback" not in result.output


OWN_SETTINGS_MODULE = """
from pipeline import Pipeline


class Team:
    async def intercept(self, call, next):
        return await next(call)

    def enqueue_headers(self):
        return {{"team": "reports"}}


app = Pipeline(namespace={namespace!r}, bootstrap_servers={servers!r}, middleware=[Team()])


@app.job("report.build", priority="high")
def build(report_id: int) -> None: ...
"""


def test_with_app_the_job_goes_where_the_application_sends_its_own(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The application sets its namespace and servers in code: the command sends there, with
    its interceptors' headers, as the application does, not to the environment's namespace."""
    name = f"ownapp_{tmp_path.name.replace('-', '_')}"
    source = OWN_SETTINGS_MODULE.format(
        namespace=settings.namespace, servers=settings.bootstrap_servers
    )
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    apply_topics(settings)
    nowhere = {"PIPELINE_NAMESPACE": "elsewhere", "PIPELINE_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    try:
        args = ["enqueue", "report.build", "--app", name, "--payload", '{"report_id": 3}']
        result = CliRunner().invoke(cli, [*args, "--json", "--timeout", "20"], env=nowhere)
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["topic"] == f"{settings.namespace}.jobs.high"
        [message] = read_all(settings.bootstrap_servers, f"{settings.namespace}.jobs.high", 1)
        job = JobCodec().decode(message.value() or b"")
        assert job.headers.get("team") == "reports"
        # A --namespace on the command line wins; --config is refused, naming why.
        other = [*args, "--namespace", "elsewhere", "--bootstrap-servers", "127.0.0.1:1"]
        result = CliRunner().invoke(cli, [*other, "--timeout", "1"])
        assert result.exit_code == 1, result.output
        config = tmp_path / "pipeline.toml"
        config.write_text('namespace = "x"\n')
        result = CliRunner().invoke(cli, [*args, "--config", str(config)])
        assert result.exit_code == 2, result.output
        assert "--config and --app" in result.output
    finally:
        sys.modules.pop(name, None)
