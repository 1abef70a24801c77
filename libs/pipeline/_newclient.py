"""Making a librdkafka client: options it refuses are a settings error that names them.

librdkafka checks its options when a client is made (``No such configuration property``, a
value out of range, an option the group protocol does not take) and raises ``KafkaException``;
every client of the library and the services is made through :func:`client`, so the commands
say ``invalid Kafka client settings: ...`` and exit 2, where a traceback came. A TLS file that
does not exist is named first: librdkafka's own words for it are an OpenSSL error code.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from ._errors import ConfigurationError

__all__ = ["client"]

C = TypeVar("C")

_FILES = {
    "ssl.ca.location": "security.ssl_ca_location",
    "ssl.certificate.location": "security.ssl_certificate_location",
    "ssl.key.location": "security.ssl_key_location",
}
"""librdkafka's options that name a file, and the settings that set them."""


def client(make: Callable[..., C], conf: Mapping[str, Any], **kwargs: Any) -> C:
    """``make(conf, **kwargs)`` (``Producer``, ``Consumer``, ``AdminClient``...), or
    :class:`ConfigurationError` for options librdkafka refuses."""
    _check_files(conf)
    try:
        return make(dict(conf), **kwargs)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        reason = error.str() if isinstance(error, KafkaError) else str(error)
        raise ConfigurationError(f"invalid Kafka client settings: {reason}") from exc


def _check_files(conf: Mapping[str, Any]) -> None:
    for option, setting in _FILES.items():
        path = conf.get(option)
        if path is None or (option == "ssl.ca.location" and path == "probe"):
            continue  # "probe": librdkafka looks for the system's CA bundle
        exists = os.path.exists(path)  # the CA may be a directory of certificates
        if not exists or not os.access(path, os.R_OK):
            variable = "PIPELINE_" + setting.upper().replace(".", "__")
            what = "cannot be read" if exists else "does not exist"
            raise ConfigurationError(
                f"invalid Kafka client settings: {option} {path} {what} "
                f"(set by {setting}, {variable}, or the kafka options)"
            )
