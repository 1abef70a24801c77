"""Which client errors are Kafka refusing the credentials, and what the error then says."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka import KafkaError
from pydantic import SecretStr

from pipeline import KafkaAuthenticationError, Settings
from pipeline._authfailure import REFUSAL_FRESH_S, authentication_error, is_refusal, is_refused
from pipeline._clientlog import LastProblemLog
from pipeline._producer import KafkaTransport
from pipeline._settings import SecuritySettings

SASL = (
    "sasl_ssl://localhost:9093/bootstrap: SASL authentication error: Authentication failed "
    "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 "
    "(after 312ms in state AUTH_REQ)"
)
MECHANISM = (
    "sasl_ssl://localhost:9093/bootstrap: SASL SCRAM-SHA-256 mechanism handshake failed: "
    "Broker: Unsupported SASL mechanism: broker's supported mechanisms: SCRAM-SHA-512 "
    "(after 303ms in state AUTH_HANDSHAKE)"
)
BAD_CA = (
    "sasl_ssl://localhost:9093/bootstrap: SSL handshake failed: error:0A000086:SSL "
    "routines::certificate verify failed: broker certificate could not be verified, verify "
    "that ssl.ca.location is correctly configured or root CA certificates are installed "
    "(after 22ms in state SSL_HANDSHAKE)"
)
REFUSED_CONNECTION = (
    "localhost:9093/bootstrap: Connect to ipv4#127.0.0.1:9093 failed: Connection refused "
    "(after 0ms in state CONNECT)"
)
CUT_OFF = "sasl_ssl://localhost:9093/bootstrap: SSL handshake failed: Disconnected"
SASL_CUT_OFF = (
    "GroupCoordinator: SASL authentication error: SaslAuthenticateRequest failed: "
    "Local: Broker transport failure"
)
"""The SASL exchange cut off by a connection that went away: no answer, no refusal."""


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (KafkaError._AUTHENTICATION, SASL),
        (KafkaError._AUTHENTICATION, MECHANISM),
        (KafkaError._SSL, BAD_CA),
        (None, SASL),
        (None, MECHANISM),
        (None, BAD_CA),
    ],
)
def test_refusals(code: int | None, text: str) -> None:
    assert is_refusal(code, text)


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (KafkaError._TRANSPORT, REFUSED_CONNECTION),
        (KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down"),
        (KafkaError._SSL, CUT_OFF),  # a broker going away mid-handshake: an outage
        (KafkaError._TRANSPORT, CUT_OFF),
        (KafkaError._AUTHENTICATION, SASL_CUT_OFF),  # a worker stopped with exit 4 on it
        (None, SASL_CUT_OFF),
        (None, REFUSED_CONNECTION),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed"),
    ],
)
def test_outages_and_other_errors_are_not_refusals(code: int | None, text: str) -> None:
    assert not is_refusal(code, text)


def test_an_error_callbacks_error() -> None:
    assert is_refused(KafkaError(KafkaError._AUTHENTICATION, SASL))
    assert not is_refused(KafkaError(KafkaError._TRANSPORT, REFUSED_CONNECTION))


def settings(**security: object) -> Settings:
    return Settings(
        bootstrap_servers="kafka-1:9093",
        security=SecuritySettings.model_validate(
            {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", **security}
        ),
    )


def test_the_message_names_mechanism_and_user_never_the_password() -> None:
    password = "hunter2-very-secret"
    error = authentication_error(
        settings(sasl_username="alice", sasl_password=SecretStr(password)),
        SASL.replace("SCRAM-SHA-512 ", f"SCRAM-SHA-512 ({password}) "),
    )
    assert isinstance(error, KafkaAuthenticationError)
    assert error.exit_code == 4
    text = str(error)
    assert text.startswith(
        "Kafka at kafka-1:9093 refused the credentials of SASL user 'alice' "
        "(SCRAM-SHA-512 over SASL_SSL): SASL authentication error: Authentication failed"
    )
    assert "PIPELINE_SECURITY__SASL_PASSWORD" in text
    assert password not in text  # even where librdkafka's text had it
    assert "after 312ms" not in text
    assert "sasl_ssl://" not in error.cause


def test_a_tls_refusal_points_at_the_ca() -> None:
    error = authentication_error(settings(ssl_ca_location=Path("ca.pem")), BAD_CA)
    assert str(error).startswith("the TLS handshake with Kafka at kafka-1:9093 failed")
    assert "check PIPELINE_SECURITY__SSL_CA_LOCATION" in str(error)


def test_the_admin_clients_log_keeps_the_refusal() -> None:
    log = LastProblemLog()
    log.log(logging.ERROR, "%s [%s] %s", "FAIL", "a#1", f"[thrd:x]: {REFUSED_CONNECTION}")
    assert log.refused(settings()) is None
    log.log(logging.ERROR, "%s [%s] %s", "FAIL", "a#1", f"[thrd:x]: {SASL}")
    refused = log.refused(settings(sasl_username="bob"))
    assert refused is not None
    assert "SASL user 'bob'" in str(refused)


def test_a_producers_refusal_counts_while_librdkafka_repeats_it() -> None:
    transport = KafkaTransport(settings(sasl_username="carol"))
    assert transport.refused() is None
    transport._refusal.report(SASL)
    refused = transport.refused()
    assert refused is not None
    assert "SASL user 'carol'" in str(refused)
    transport._refusal._at -= REFUSAL_FRESH_S + 1  # not repeated since: accepted now, maybe
    assert transport.refused() is None
