"""Settings: defaults, environment, config file, code, and secrets."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

import pipeline_scheduler._cli
import pipeline_scheduler._runtime
import pipeline_worker._cli
import pipeline_worker._runtime
from pipeline import ConfigurationError, Pipeline, Settings
from pipeline._errors import SettingsError
from pipeline._invalidsettings import settings_error, unused_sections
from pipeline._job import Priority
from pipeline._settings import TopicSettings, build_settings
from pipeline._websettings import WebSettings
from pipeline._workersettings import WorkerSettings
from pipeline_cli import cli


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("PIPELINE_"):
            monkeypatch.delenv(name)


def test_defaults_run_against_the_dev_broker() -> None:
    settings = Settings()
    assert settings.bootstrap_servers == "localhost:9092"
    assert settings.namespace == "pipeline"
    assert settings.client_config() == {
        "bootstrap.servers": "localhost:9092",
        "client.id": "pipeline",
        "security.protocol": "PLAINTEXT",
    }
    assert settings.worker.weights == [10, 5, 3, 1]
    assert settings.worker.priorities == list(Priority)


def test_environment_variables_including_nested(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_BOOTSTRAP_SERVERS", "k1:9092,k2:9092")
    monkeypatch.setenv("PIPELINE_NAMESPACE", "billing")
    monkeypatch.setenv("PIPELINE_TOPICS__PARTITIONS", "24")
    monkeypatch.setenv("PIPELINE_TOPICS__RETRY_DELAYS_S", "[1, 10]")
    monkeypatch.setenv("PIPELINE_WORKER__POLICY", "strict")
    monkeypatch.setenv("PIPELINE_KAFKA", '{"socket.keepalive.enable": "true"}')
    settings = Settings()
    assert settings.bootstrap_servers == "k1:9092,k2:9092"
    assert settings.namespace == "billing"
    assert settings.topics.partitions == 24
    assert settings.topics.retry_delays_s == [1.0, 10.0]
    assert settings.worker.policy == "strict"
    assert settings.client_config()["socket.keepalive.enable"] == "true"


def test_code_beats_environment_beats_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text(
        'namespace = "from-file"\nclient_id = "file-client"\n'
        "[topics]\npartitions = 3\nreplication_factor = 3\nmin_insync_replicas = 2\n"
    )
    monkeypatch.setenv("PIPELINE_CLIENT_ID", "env-client")
    settings = Settings.from_file(config, namespace="from-code")
    assert settings.namespace == "from-code"
    assert settings.client_id == "env-client"
    assert settings.topics.partitions == 3
    assert settings.topics.effective_min_insync_replicas == 2


def test_librdkafka_options_given_as_numbers_or_booleans_are_read_as_its_text(
    tmp_path: Path,
) -> None:
    """As docs/scheduler.md writes it (`kafka."message.max.bytes"`): TOML's integer was refused
    ("Input should be a valid string"), only the quoted form was taken."""
    config = tmp_path / "pipeline.toml"
    config.write_text(
        '[kafka]\n"message.max.bytes" = 1040000\n"enable.ssl.certificate.verification" = false\n'
        '"queue.buffering.max.ms" = 2.5\n"socket.timeout.ms" = 60000.0\n'
        '[worker.kafka_consumer]\n"fetch.max.bytes" = 1048576\n'
    )
    settings = Settings.from_file(config)
    assert settings.kafka == {
        "message.max.bytes": "1040000",
        "enable.ssl.certificate.verification": "false",
        "queue.buffering.max.ms": "2.5",
        "socket.timeout.ms": "60000",
    }
    assert settings.client_config()["message.max.bytes"] == "1040000"
    assert settings.worker.kafka_consumer == {"fetch.max.bytes": "1048576"}


def test_config_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "p.toml"
    config.write_text('bootstrap_servers = "kafka:9093"\n')
    monkeypatch.setenv("PIPELINE_CONFIG_FILE", str(config))
    assert Settings().bootstrap_servers == "kafka:9093"


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        Settings.from_file(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "does not exist or is not a file"),  # a typo in the path
        (b"namespace = \n", "cannot be read as TOML"),
        (b"\xff\xfe", "cannot be read as TOML"),
    ],
)
def test_a_config_file_named_by_the_environment_must_be_readable_toml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes | None, error: str
) -> None:
    """Skipped silently, a wrong path ran every command with the defaults (the namespace
    ``pipeline`` included); bad TOML gave a traceback."""
    config = tmp_path / "pipeline.toml"
    if content is not None:
        config.write_bytes(content)
    monkeypatch.setenv("PIPELINE_CONFIG_FILE", str(config))
    with pytest.raises(ConfigurationError, match=error):
        Settings()
    result = CliRunner().invoke(
        cli, ["acls", "plan", "--role", "producer", "--principal", "User:x"]
    )
    assert result.exit_code == 2, result.output
    assert error in result.output


@pytest.mark.parametrize("name", ["jobs_retention_ms", "dlq_retention_ms", "events_retention_ms"])
@pytest.mark.parametrize("value", [0, 1, 3_599_999])
def test_a_topic_retention_under_an_hour_is_refused(name: str, value: int) -> None:
    """Kafka would delete waiting jobs as soon as their segment rolled (0 was accepted)."""
    with pytest.raises(ValidationError, match="at least 3600000"):
        TopicSettings(**{name: value})
    assert getattr(TopicSettings(**{name: -1}), name) == -1


def test_security_maps_to_librdkafka_and_hides_secrets() -> None:
    settings = Settings(
        security={
            "protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "svc",
            "sasl_password": "hunter2",
            "ssl_ca_location": "/etc/ssl/ca.pem",
        }
    )
    conf = settings.client_config()
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert conf["sasl.username"] == "svc"
    assert conf["sasl.password"] == "hunter2"
    assert conf["ssl.ca.location"] == "/etc/ssl/ca.pem"
    assert "hunter2" not in repr(settings)
    assert "hunter2" not in str(settings.model_dump())


@pytest.mark.parametrize(
    "bad",
    [
        {"namespace": "has space"},
        {"namespace": "n" * 201},  # its topics' names would be longer than Kafka takes
        {"topics": {"partitions": 0}},
        {"topics": {"retry_delays_s": [30, 5]}},
        {"topics": {"retry_delays_s": [5, "inf"]}},  # the worker failed at its start
        {"topics": {"retry_delays_s": ["nan"]}},
        {"topics": {"replication_factor": 1, "min_insync_replicas": 2}},
        {"worker": {"weights": [1, 2]}},
        {"worker": {"policy": "random"}},
        {"unknown_setting": 1},
        {"bootstrap_servers": ""},
        {"bootstrap_servers": " , "},
    ],
)
def test_invalid_settings_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings(**bad)  # type: ignore[arg-type]


def test_min_insync_replicas_default_follows_replication() -> None:
    assert Settings().topics.effective_min_insync_replicas == 1
    assert Settings(topics={"replication_factor": 3}).topics.effective_min_insync_replicas == 2


def test_an_invalid_environment_value_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_WORKER__CONCURRENCY", "abc")
    with pytest.raises(ConfigurationError) as raised:
        Pipeline()
    message = str(raised.value)
    assert message.startswith(
        "invalid settings: worker.concurrency (environment variable "
        "PIPELINE_WORKER__CONCURRENCY): Input should be a valid integer"
    )
    assert "got 'abc'" in message
    assert isinstance(raised.value.__cause__, ValidationError)


def test_an_empty_bootstrap_servers_variable_is_a_setting_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not a wait for a Kafka that is not named, reported as unreachable."""
    monkeypatch.setenv("PIPELINE_BOOTSTRAP_SERVERS", "")
    with pytest.raises(ConfigurationError) as raised:
        Pipeline()
    assert "bootstrap_servers (environment variable PIPELINE_BOOTSTRAP_SERVERS)" in str(
        raised.value
    )
    assert "names no server" in str(raised.value)


@pytest.mark.parametrize(
    "server", ["localhost:notaport", "kafka:0", "kafka:70000", "kafka:", "kafka:\u00b2"]
)
def test_a_server_without_a_valid_port_is_a_setting_error(
    monkeypatch: pytest.MonkeyPatch, server: str
) -> None:
    """librdkafka reads it as port 0: the client waited its timeout for a broker it never
    tried, then called Kafka unreachable."""
    monkeypatch.setenv("PIPELINE_BOOTSTRAP_SERVERS", f"kafka-0:9092,{server}")
    with pytest.raises(ConfigurationError) as raised:
        Pipeline()
    assert f"{server!r} has no valid port" in str(raised.value)


@pytest.mark.parametrize(
    "servers", ["kafka", "kafka:9092,kafka-1:9093", "[::1]:9092", "[::1]", "SSL://kafka:9093"]
)
def test_servers_librdkafka_reads_are_taken(servers: str) -> None:
    assert Settings(bootstrap_servers=servers).bootstrap_servers == servers


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PIPELINE_WORKER__TENANTS__NAMED", "notjson"),
        ("PIPELINE_WORKER__TENANTS", '{"fairness": tru'),
        ("PIPELINE_TOPICS__RETRY_DELAYS_S", "5,30"),
        ("PIPELINE_KAFKA", '{"sasl.password": "s3cret-value'),
    ],
)
def test_a_list_or_mapping_variable_that_is_not_json_is_named_as_a_setting_error(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """pydantic-settings' own error named only the section ("error parsing value for field
    'worker'"), and an application importing Pipeline() failed with its traceback."""
    monkeypatch.setenv(variable, value)
    monkeypatch.setenv("PIPELINE_WORKER__CONCURRENCY", "8")  # a number: no JSON needed
    with pytest.raises(ConfigurationError) as raised:
        Pipeline()
    message = str(raised.value)
    assert message.startswith(f"invalid settings: {variable} is not JSON (")
    assert "CONCURRENCY" not in message
    assert "s3cret" not in message


def test_a_secret_is_not_repeated_in_the_error() -> None:
    with pytest.raises(ConfigurationError) as raised:
        build_settings(security={"sasl_password": 12345})
    assert "12345" not in str(raised.value)
    assert "security.sasl_password" in str(raised.value)


@pytest.mark.parametrize(
    ("service", "setting"),
    [("pipeline_worker", "worker.concurrency"), ("pipeline_scheduler", "scheduler.horizon_s")],
)
def test_services_report_an_invalid_setting_in_one_line_and_exit_2(
    service: str, setting: str, tmp_path: Path
) -> None:
    (tmp_path / "badenvapp.py").write_text("from pipeline import Pipeline\n\napp = Pipeline()\n")
    variable = "PIPELINE_" + setting.replace(".", "__").upper()
    result = subprocess.run(
        [sys.executable, "-m", service, "--app", "badenvapp:app"],
        cwd=tmp_path,
        env={**os.environ, variable: "abc"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert line.startswith(f"Error: invalid settings: {setting} (environment variable {variable})")


def test_an_invalid_value_given_as_an_option_names_the_option(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An option wins over the variable of the same setting: the variable is not to blame."""
    monkeypatch.setenv("PIPELINE_NAMESPACE", "fine")
    with pytest.raises(ValidationError) as raised:
        Settings(namespace="bad namespace!")
    options = {"namespace": "--namespace"}
    message = str(settings_error(raised.value, options=options))
    assert message.startswith("invalid settings: namespace (option --namespace): String should")
    assert "PIPELINE_NAMESPACE" not in message
    assert message.endswith("Fix the value (command line, environment, config file or code) "
                            "and start again")  # fmt: skip
    message = str(settings_error(raised.value))
    assert "namespace (environment variable PIPELINE_NAMESPACE)" in message


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """The services configure the root logger; the next tests get it back as it was."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_an_invalid_section_a_service_does_not_use_is_warned_about_and_left_at_defaults(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text('namespace = "from-file"\n[web]\nport = -1\n')
    monkeypatch.setenv("PIPELINE_WORKER__CONCURRENCY", "0")
    monkeypatch.setenv("PIPELINE_WORKER__POLICY", "fifo")
    with unused_sections("pipeline-scheduler", "worker", "web"):
        settings = Settings.from_file(config, scheduler={"horizon_s": 300})
        again = Pipeline().settings
    assert settings.worker == WorkerSettings()
    assert settings.web == WebSettings()
    assert (settings.namespace, settings.scheduler.horizon_s) == ("from-file", 300)
    assert again.worker == WorkerSettings()
    warnings = [r.getMessage() for r in caplog.records if r.name == "pipeline.settings"]
    assert warnings == [  # once each, however many times the settings are built
        "pipeline-scheduler does not use the web settings and ignores these invalid ones: "
        "web.port: Input should be greater than or equal to 0, got -1",
        "pipeline-scheduler does not use the worker settings and ignores these invalid ones: "
        "worker.policy (environment variable PIPELINE_WORKER__POLICY): Input should be "
        "'strict' or 'weighted', got 'fifo'; worker.concurrency (environment variable "
        "PIPELINE_WORKER__CONCURRENCY): Input should be greater than or equal to 1, got '0'",
    ]
    # What the service uses is still checked; outside the scope, everything is.
    with unused_sections("pipeline-worker", "scheduler", "web"), pytest.raises(SettingsError):
        Pipeline()
    with pytest.raises(SettingsError, match=r"worker\.concurrency \(environment variable"):
        Pipeline()


@pytest.mark.usefixtures("restored_logging")
@pytest.mark.parametrize(
    ("service", "variable", "with_app"),
    [
        ("pipeline-scheduler", "PIPELINE_WORKER__CONCURRENCY", True),
        ("pipeline-scheduler", "PIPELINE_WORKER__CONCURRENCY", False),
        ("pipeline-scheduler", "PIPELINE_WEB__PORT", True),
        ("pipeline-worker", "PIPELINE_SCHEDULER__HORIZON_S", True),
        ("pipeline-worker", "PIPELINE_WEB__PORT", True),
    ],
)
def test_a_service_starts_despite_an_invalid_setting_it_does_not_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, service: str, variable: str, with_app: bool
) -> None:
    """A bad worker setting in an environment shared with the workers stopped the scheduler
    (exit 2), which never reads it; the services name and ignore it now."""
    module = f"sharedenv_{service.replace('-', '_')}_{variable.lower()}_{with_app}"
    (tmp_path / f"{module}.py").write_text("from pipeline import Pipeline\n\napp = Pipeline()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, module, None)  # removed again afterwards
    del sys.modules[module]
    started: list[Settings] = []

    class Runtime:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            started.append(next(a for a in args if isinstance(a, Settings)))

        def run(self) -> int:
            return 0

    if service == "pipeline-worker":
        monkeypatch.setattr(pipeline_worker._runtime, "Worker", Runtime)
        monkeypatch.setattr(gc, "freeze", lambda: None)  # not this test process's collector
        monkeypatch.setattr(gc, "set_threshold", lambda *args: None)
        command = pipeline_worker._cli.command
    else:
        monkeypatch.setattr(pipeline_scheduler._runtime, "Scheduler", Runtime)
        command = pipeline_scheduler._cli.main
    result = CliRunner().invoke(
        command, ["--app", module] if with_app else [], env={variable: "-1"}
    )
    assert result.exit_code == 0, result.output
    section = variable.removeprefix("PIPELINE_").partition("__")[0].lower()
    assert f"{service} does not use the {section} settings and ignores these invalid ones: " in (
        result.output
    )
    assert f"(environment variable {variable})" in result.output
    [settings] = started
    assert getattr(settings, section) == type(getattr(settings, section))()


def test_the_longest_namespace_makes_topic_names_kafka_takes() -> None:
    from pipeline._topiccheck import topic_name_problem
    from pipeline._topics import TopicNames
    from pipeline._topicspec import deferred_tier_topic, scheduler_control_topic

    namespace = Settings(namespace="n" * 200).namespace
    names = TopicNames(namespace)
    topics = [*names.all_jobs(), names.retry(99), names.deferred, names.dlq, names.dlq_state]
    topics += [names.dedup, names.schedules, names.scheduler_state, names.events, names.workers]
    topics += [scheduler_control_topic(namespace), deferred_tier_topic(namespace, 99)]
    assert [t for t in topics if topic_name_problem(t)] == []


@pytest.mark.parametrize("ttl", ["inf", "1e11", "nan"])
def test_a_dedup_ttl_beyond_what_a_key_can_be_held_is_refused_at_the_start(ttl: str) -> None:
    # Accepted, it made every keyed job's admission fail (a store failure: the job ran) and so
    # turned deduplication off, duplicates included, with a warning per job.
    with pytest.raises(ValidationError, match="dedup_ttl_s"):
        WorkerSettings(dedup_ttl_s=ttl)


def test_a_dedup_restore_timeout_past_a_day_is_refused() -> None:
    # inf was accepted, then every `topics apply`, and the start of each worker and scheduler,
    # ended in an OverflowError while sizing the tombstones' retention.
    for timeout in ("inf", "1e300", "86401"):
        with pytest.raises(ValidationError, match="dedup_restore_timeout_s"):
            WorkerSettings(dedup_restore_timeout_s=timeout)
