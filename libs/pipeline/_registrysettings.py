"""Settings of the optional Confluent-compatible Schema Registry mode (``schema_registry.*``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator

from ._redact import RedactedRepr


class SchemaRegistrySettings(RedactedRepr, BaseModel):
    """Where the registry is, and whether job envelopes are written in its wire format.

    With ``url`` set, every reader of jobs (worker, scheduler) also accepts envelopes in the
    Confluent wire format (``00``, a 4-byte schema id, the Avro body), and
    :class:`~pipeline.schemaregistry.RegistryAvroPayload` job types can reach the registry.
    """

    model_config = {"extra": "forbid", "hide_input_in_errors": True}

    url: str | None = Field(
        None,
        description="the registry's base URL, e.g. http://registry:8081 (Apicurio: "
        "http://registry:8080/apis/ccompat/v7); unset: the mode is off",
    )
    envelope: bool = Field(
        False,
        description="write job envelopes in the registry's wire format too (readers need "
        "schema_registry.url then); off: single-object encoding, readable without a registry",
    )
    envelope_subject: str | None = Field(
        None,
        description="the subject the pipeline.Job schema is registered under; unset: "
        "<namespace>.jobs-value",
    )
    client: dict[str, str | bool | int | float] = Field(
        default_factory=dict,
        description="options for confluent-kafka's SchemaRegistryClient, passed as they are, "
        "e.g. basic.auth.user.info, ssl.ca.location, timeout (seconds a request may take; "
        "default 5), max.retries (default 0: the library retries by itself)",
    )

    @field_validator("url")
    @classmethod
    def _http(cls, url: str | None) -> str | None:
        if url is not None and not all(
            each.strip().lower().startswith(("http://", "https://")) for each in url.split(",")
        ):
            # Not shown (hide_input_in_errors): a URL without its scheme may carry a password.
            raise ValueError("each URL must start with http:// or https://")
        return url

    @field_validator("client", mode="before")
    @classmethod
    def _numbers(cls, client: Any) -> Any:
        """An environment variable is a string: the client's numeric options are numbers
        (given as "5", ``timeout`` was refused by the client with a traceback)."""
        if not isinstance(client, dict):
            return client
        return {
            key: _number(value) if key in _NUMERIC_OPTIONS and isinstance(value, str) else value
            for key, value in client.items()
        }


_NUMERIC_OPTIONS = frozenset(
    {
        "timeout",
        "max.retries",
        "retries.wait.ms",
        "retries.max.wait.ms",
        "cache.capacity",
        "cache.latest.ttl.sec",
    }
)


def _number(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text  # the client says what is wrong with it
