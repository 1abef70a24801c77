"""Making a librdkafka client: options it refuses are a settings error that names them.

librdkafka checks its options when a client is made (``No such configuration property``, a
value out of range, an option the group protocol does not take) and raises ``KafkaException``;
every client of the library and the services is made through :func:`client`, so the commands
say ``invalid Kafka client settings: ...`` and exit 2, where a traceback came.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from ._errors import ConfigurationError

__all__ = ["client"]

C = TypeVar("C")


def client(make: Callable[..., C], conf: Mapping[str, Any], **kwargs: Any) -> C:
    """``make(conf, **kwargs)`` (``Producer``, ``Consumer``, ``AdminClient``...), or
    :class:`ConfigurationError` for options librdkafka refuses."""
    try:
        return make(dict(conf), **kwargs)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        reason = error.str() if isinstance(error, KafkaError) else str(error)
        raise ConfigurationError(f"invalid Kafka client settings: {reason}") from exc
