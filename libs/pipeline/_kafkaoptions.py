"""librdkafka options passed through the settings (``kafka``, ``worker.kafka_consumer``): their
values as the text librdkafka reads, where TOML and JSON give numbers and booleans as such."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator

__all__ = ["KafkaOptions", "as_text"]


def as_text(options: Any) -> Any:
    """``options`` (a mapping) with its numbers and booleans as librdkafka's text; anything else
    is left for the settings' validation to refuse."""
    if not isinstance(options, dict):
        return options
    return {key: _text(value) for key, value in options.items()}


def _text(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    return value


KafkaOptions = Annotated[dict[str, str], BeforeValidator(as_text)]
"""The type of a settings field of librdkafka options passed through."""
