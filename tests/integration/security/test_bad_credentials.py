"""Bad credentials against the secured node: recognised as such at once, never as an outage.

A wrong password (or a CA that did not sign the brokers' certificates) makes librdkafka retry
forever, as for a broker that is down. Here: ``enqueue`` raises
:class:`KafkaAuthenticationError` within seconds, ``pipeline enqueue`` exits 4 with the clear
message, and ``pipeline-worker`` and ``pipeline-scheduler`` log it once and exit 4; the
password appears in no output. The right password still carries a job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from pydantic import SecretStr

from pipeline import KafkaAuthenticationError, KafkaUnavailableError, Pipeline, Settings
from pipeline._admin import apply_topics
from pipeline_cli._devsecurity import _certificates

REPO = Path(__file__).resolve().parents[3]
REFUSED_EXIT = 4
WITHIN_S = 15.0
"""A generous bound on how long a refused client may take to say so (it takes 1 to 3 s)."""
PROCESS_WITHIN_S = 60.0
"""A bound on a refused service's exit, start-up included."""
PIPELINE = [str(Path(sys.executable).parent / "pipeline")]
CLEAR_LINE = "refused the credentials of SASL user 'admin' (SCRAM-SHA-512 over SASL_SSL)"


@pytest.fixture
def wrong_password() -> str:
    return f"wrong-{uuid.uuid4().hex}"


@pytest.fixture
def wrong_settings(secure_settings: Settings, wrong_password: str) -> Settings:
    security = secure_settings.security.model_copy(
        update={"sasl_password": SecretStr(wrong_password)}
    )
    return secure_settings.model_copy(update={"security": security})


def env_of(settings: Settings) -> dict[str, str]:
    """The environment of a process with ``settings``' connection (its password included)."""
    security = settings.security
    assert security.sasl_password is not None
    env = {
        **os.environ,
        "PIPELINE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "PIPELINE_NAMESPACE": settings.namespace,
        "PIPELINE_SECURITY__PROTOCOL": security.protocol,
        "PIPELINE_SECURITY__SASL_MECHANISM": str(security.sasl_mechanism),
        "PIPELINE_SECURITY__SASL_USERNAME": str(security.sasl_username),
        "PIPELINE_SECURITY__SASL_PASSWORD": security.sasl_password.get_secret_value(),
        "PIPELINE_SECURITY__SSL_CA_LOCATION": str(security.ssl_ca_location),
    }
    env.pop("PIPELINE_CONFIG_FILE", None)
    return env


def run(command: list[str], settings: Settings) -> tuple[subprocess.CompletedProcess[str], float]:
    """Runs ``command`` with ``settings``; the result (stdout and stderr together) and its time."""
    started = time.monotonic()
    done = subprocess.run(
        command,
        env=env_of(settings),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=PROCESS_WITHIN_S,
        check=False,
    )
    return done, time.monotonic() - started


def test_enqueue_raises_the_typed_error_within_seconds(
    wrong_settings: Settings, wrong_password: str
) -> None:
    app = Pipeline(wrong_settings)
    started = time.monotonic()
    with pytest.raises(KafkaAuthenticationError) as caught:
        app.enqueue("secured", {"n": 1}, wait=True)
    elapsed = time.monotonic() - started
    assert elapsed < WITHIN_S, f"refused after {elapsed:.1f}s"
    error = caught.value
    assert not isinstance(error, KafkaUnavailableError)  # not taken for an outage
    assert CLEAR_LINE in str(error)
    assert wrong_settings.bootstrap_servers in str(error)
    assert "PIPELINE_SECURITY__SASL_PASSWORD" in str(error)  # what to check
    assert "invalid credentials" in error.cause
    assert wrong_password not in str(error)
    with pytest.raises(KafkaAuthenticationError):
        app.enqueue("secured", {"n": 2})  # at once: nothing more is queued
    with pytest.raises(KafkaAuthenticationError):
        app.close(timeout=30)  # flush does not wait the 30 s


def test_a_ca_that_did_not_sign_the_brokers_is_a_tls_refusal(
    secure_settings: Settings, tmp_path: Path
) -> None:
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_bytes(_certificates()[1])
    security = secure_settings.security.model_copy(update={"ssl_ca_location": other_ca})
    app = Pipeline(secure_settings.model_copy(update={"security": security}))
    started = time.monotonic()
    with pytest.raises(KafkaAuthenticationError) as caught:
        app.enqueue("secured", {"n": 1}, wait=True)
    assert time.monotonic() - started < WITHIN_S
    assert "the TLS handshake with Kafka" in str(caught.value)
    assert "certificate verify failed" in str(caught.value)
    assert "PIPELINE_SECURITY__SSL_CA_LOCATION" in str(caught.value)
    with pytest.raises(KafkaAuthenticationError):
        app.close(timeout=30)


def test_the_right_password_still_carries_a_job(secure_settings: Settings) -> None:
    apply_topics(secure_settings)
    with Pipeline(secure_settings) as app:
        handle = app.submit("secured", {"n": 1}).wait(timeout=60)
    assert handle.topic == f"{secure_settings.namespace}.jobs.default"
    assert handle.offset is not None


def test_pipeline_enqueue_exits_4_with_the_clear_message(
    wrong_settings: Settings, wrong_password: str
) -> None:
    command = [*PIPELINE, "enqueue", "secured", "--payload", "{}"]
    done, elapsed = run(command, wrong_settings)
    assert done.returncode == REFUSED_EXIT, done.stdout
    assert elapsed < WITHIN_S + 5, done.stdout  # the interpreter's start included
    assert f"Error: Kafka at {wrong_settings.bootstrap_servers} {CLEAR_LINE}" in done.stdout
    assert "is it running?" not in done.stdout
    assert wrong_password not in done.stdout


def test_pipeline_status_exits_4_with_the_clear_message(
    wrong_settings: Settings, wrong_password: str
) -> None:
    done, _ = run([*PIPELINE, "status"], wrong_settings)
    assert done.returncode == REFUSED_EXIT, done.stdout
    assert CLEAR_LINE in done.stdout
    assert "is Kafka running?" not in done.stdout
    assert wrong_password not in done.stdout


@pytest.mark.parametrize("command", [["ls"], ["pause", "nightly"]])
def test_pipeline_schedules_exits_4_with_the_clear_message(
    wrong_settings: Settings, wrong_password: str, command: list[str]
) -> None:
    """Not exit 1 after its timeout, as though Kafka were down."""
    done, _ = run([*PIPELINE, "schedules", *command], wrong_settings)
    assert done.returncode == REFUSED_EXIT, done.stdout
    assert CLEAR_LINE in done.stdout
    assert wrong_password not in done.stdout


def assert_one_clear_line(output: str, wrong_password: str) -> None:
    assert wrong_password not in output
    lines = output.splitlines()
    clear = [line for line in lines if CLEAR_LINE in line]
    assert len(clear) == 1, output
    assert " ERROR " in clear[0], output
    assert "stopping: " in clear[0], output
    about_it = [line for line in lines if "SASL authentication" in line]
    assert len(about_it) <= 3, output  # no flood of librdkafka's repeats


def test_pipeline_worker_logs_once_and_exits_4(
    wrong_settings: Settings, wrong_password: str
) -> None:
    app = "tests.integration.scheduler.cronapp:app"
    done, _ = run([sys.executable, "-m", "pipeline_worker", "--app", app], wrong_settings)
    assert done.returncode == REFUSED_EXIT, done.stdout
    assert_one_clear_line(done.stdout, wrong_password)


def test_pipeline_scheduler_logs_once_and_exits_4(
    wrong_settings: Settings, wrong_password: str
) -> None:
    done, _ = run([sys.executable, "-m", "pipeline_scheduler"], wrong_settings)
    assert done.returncode == REFUSED_EXIT, done.stdout
    assert_one_clear_line(done.stdout, wrong_password)
