"""Whether a Kafka client's error is Kafka refusing this client, not Kafka being unreachable.

librdkafka reports a refused connection as it reports an outage: it retries every few hundred
milliseconds, forever, with an error callback and a log line each time, and says
``_ALL_BROKERS_DOWN`` once. Waiting for that to pass, as for an outage, only delays the one
message that matters. :func:`is_refusal` tells the two apart, for the error callbacks
(:class:`~pipeline._brokerhealth.BrokerHealth`) and the log lines
(:class:`~pipeline._clientlog.LastProblemLog`) of every client; :func:`authentication_error`
turns one into the :class:`KafkaAuthenticationError` that says what to check.

What counts as a refusal:

* ``_AUTHENTICATION``: the SASL exchange failed (a wrong user name or password, a mechanism
  the brokers do not enable: ``SASL authentication error: ... invalid credentials``,
  ``SASL SCRAM-SHA-256 mechanism handshake failed: ... Unsupported SASL mechanism``).
  A SASL request that failed on this side (``SaslAuthenticateRequest failed: Local: Broker
  transport failure``: the connection went away mid-exchange) is no refusal: no broker
  answered it.
* A TLS handshake that failed over a certificate (``SSL handshake failed: ... certificate
  verify failed``: the CA does not match the brokers' certificates; or the brokers rejected the
  client's certificate). A handshake cut off for another reason (a broker going away mid-way)
  stays a connection error: an outage must not stop a worker.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError

from ._errors import KafkaAuthenticationError

if TYPE_CHECKING:
    from ._settings import Settings

__all__ = ["REFUSAL_FRESH_S", "Refusal", "authentication_error", "is_refusal", "is_refused"]

REFUSAL_FRESH_S = 30.0
"""A refusal counts this long after librdkafka last reported it (it repeats it at each attempt,
every second or so): a producer whose credentials are accepted later works again."""

_SASL = re.compile(r"SASL authentication error|SASL \S+ mechanism handshake failed")
_UNANSWERED = re.compile(r"Request failed: Local: ")
"""A SASL request librdkafka failed itself (the connection went away, a timeout)."""
_TLS_CODES = frozenset({KafkaError._SSL, KafkaError._TRANSPORT})
# librdkafka's prefix (the broker) and suffix (timing, suppressed repeats) of a connection error.
_BROKER = re.compile(r"^\S+://\S+: ")
_AFTER = re.compile(r" \(after \d+ms in state [A-Z_]+(, \d+ identical error\(s\) suppressed)?\)$")


def is_refusal(code: int | None, text: str) -> bool:
    """Whether an error (``code``; None for a log line) with ``text`` is Kafka refusing this
    client's credentials or TLS handshake, as opposed to not answering."""
    if _UNANSWERED.search(text):
        return False
    if code == KafkaError._AUTHENTICATION:
        return True
    if code is not None and code not in _TLS_CODES:
        return False
    if code is None and _SASL.search(text):
        return True
    return "SSL handshake failed" in text and "certificate" in text.lower()


def is_refused(error: KafkaError) -> bool:
    """:func:`is_refusal` of an error callback's error."""
    return is_refusal(error.code(), error.str())


def authentication_error(settings: Settings, cause: str) -> KafkaAuthenticationError:
    """The error to raise (or log) for a refusal whose librdkafka text is ``cause``: names the
    cluster, the mechanism and the user, and the settings to check; never the password."""
    security = settings.security
    reason = _AFTER.sub("", _BROKER.sub("", cause.strip()))
    secret = security.sasl_password.get_secret_value() if security.sasl_password else ""
    if secret:
        reason = reason.replace(secret, "***")
    servers = settings.bootstrap_servers
    if "SSL" in reason and "SASL" not in reason:
        client = (
            " and the client certificate (PIPELINE_SECURITY__SSL_CERTIFICATE_LOCATION, "
            "PIPELINE_SECURITY__SSL_KEY_LOCATION)"
            if security.ssl_certificate_location is not None
            else ""
        )
        message = (
            f"the TLS handshake with Kafka at {servers} failed ({security.protocol}): {reason}; "
            "check PIPELINE_SECURITY__SSL_CA_LOCATION (the CA that signed the brokers' "
            f"certificates){client}"
        )
    else:
        user = security.sasl_username or "(none)"
        mechanism = security.sasl_mechanism or "(no mechanism set)"
        message = (
            f"Kafka at {servers} refused the credentials of SASL user {user!r} "
            f"({mechanism} over {security.protocol}): {reason}; check the user name and "
            "password (PIPELINE_SECURITY__SASL_USERNAME, PIPELINE_SECURITY__SASL_PASSWORD), "
            "and that the user exists on the cluster for that mechanism "
            "(PIPELINE_SECURITY__SASL_MECHANISM)"
        )
    return KafkaAuthenticationError(message, reason)


class Refusal:
    """The refusal of a client's credentials or TLS handshake librdkafka last reported
    (:meth:`report`, its error callback's), which counts for :data:`REFUSAL_FRESH_S`."""

    __slots__ = ("_at", "_settings", "_text")

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._text: str | None = None
        self._at = 0.0

    def report(self, text: str) -> None:
        self._at = time.monotonic()  # first: a thread that reads the refusal sees it fresh
        self._text = text

    def fresh(self) -> bool:
        return self._text is not None and time.monotonic() - self._at < REFUSAL_FRESH_S

    def error(self) -> KafkaAuthenticationError | None:
        """The error to raise for a fresh refusal (None: there is none)."""
        text = self._text
        if text is None or not self.fresh():
            return None
        return authentication_error(self._settings, text)
