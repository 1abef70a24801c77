"""librdkafka's log lines as confluent-kafka's ``logger`` option hands them over: one parser.

confluent-kafka calls ``logger.log(level, "%s [%s] %s", facility, client_name, text)``, where
``text`` starts with librdkafka's thread (``[thrd:host:9092/bootstrap]: ``).
:func:`split_log_call` turns such a call into ``(facility, text)`` without the thread; the
adapters built on it are :class:`LastProblemLog` here (admin and dead-letter clients: lines at
DEBUG, the last problem kept to explain a failure, a refusal of the credentials kept to raise
:class:`~pipeline.KafkaAuthenticationError` instead) and the broker-health tracker's own,
which feeds every line to :class:`~pipeline._brokerhealth.BrokerHealth`.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError

from ._authfailure import authentication_error, is_refusal

if TYPE_CHECKING:
    from ._errors import KafkaAuthenticationError
    from ._settings import Settings

__all__ = ["LastProblemLog", "is_fatal", "split_log_call"]

_log = logging.getLogger("pipeline.kafka.admin")
_THREAD = re.compile(r"^\[thrd:[^\]]*\]: ")


def is_fatal(error: KafkaError) -> bool:
    """Whether a client can do nothing more after ``error``: librdkafka flags it (``error_cb``)
    or, to a polling consumer, hands it over as a message error of code ``_FATAL`` (a static
    member id another process took, say)."""
    return bool(error.fatal()) or error.code() == KafkaError._FATAL


def split_log_call(fmt: str, args: tuple[object, ...]) -> tuple[str, str]:
    """``(facility, text)`` of one ``logger.log`` call, ``text`` without librdkafka's thread.

    A call of another shape (no facility) gives ``("", the formatted line)``.
    """
    if len(args) == 3:
        facility, _, text = (str(a) for a in args)
    else:
        facility, text = "", fmt % args if args else fmt
    return facility, _THREAD.sub("", text)


class LastProblemLog:
    """librdkafka's log lines, kept at DEBUG; the last warning or error explains a failure."""

    def __init__(self) -> None:
        self.last_problem: str | None = None
        self.refusal: str | None = None
        """The first line that says Kafka refused the client (credentials, TLS), if any."""

    def log(self, level: int, fmt: str, *args: object) -> None:
        facility, text = split_log_call(fmt, args)
        if level >= logging.WARNING:
            self.last_problem = text
            if self.refusal is None and is_refusal(None, text):
                self.refusal = text
        _log.debug("%s %s", facility, text)

    def answered(self) -> None:
        """Kafka answered the client: a refusal logged before is over (a broker refused the
        credentials a moment, as it restarted, say), and is logged again if it comes back. Kept,
        it made every later slow answer of a long-lived client a refusal of its credentials."""
        self.refusal = None

    def refused(self, settings: Settings) -> KafkaAuthenticationError | None:
        """The error to raise when Kafka refused the client, else None."""
        return authentication_error(settings, self.refusal) if self.refusal else None
