"""One settings object for the library, the worker, the scheduler and the CLI.

Values come from, highest precedence first: arguments in code, ``PIPELINE_*`` environment
variables (nested fields with ``__``, e.g. ``PIPELINE_TOPICS__PARTITIONS=12``), a TOML config file
(``PIPELINE_CONFIG_FILE`` or :meth:`Settings.from_file`), then the defaults below.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings import SettingsError as PydanticSettingsError

from ._errors import ConfigurationError
from ._invalidsettings import settings_error, unreadable_variables, unused_scope
from ._job import Priority, delay_s
from ._kafkaoptions import KafkaOptions
from ._redact import RedactedRepr
from ._registrysettings import SchemaRegistrySettings
from ._schedulersettings import SchedulerSettings
from ._websettings import WebSettings
from ._workersettings import WorkerSettings

DAY_MS = 24 * 3600 * 1000


def _port_of(server: str) -> str | None:
    """The port of ``[PROTOCOL://]HOST[:PORT]`` (``[ADDRESS]`` for IPv6), None if it names
    none (librdkafka's default then)."""
    server = server.partition("://")[2] or server
    if server.startswith("["):
        rest = server.partition("]")[2]
        return rest[1:] if rest.startswith(":") else (rest or None)
    _, colon, port = server.rpartition(":")
    return port if colon else None


class SecuritySettings(BaseModel):
    """TLS and SASL options, mapped to librdkafka's keys. Secrets are never logged."""

    model_config = {"extra": "forbid", "hide_input_in_errors": True}

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: Path | None = None
    ssl_certificate_location: Path | None = None
    ssl_key_location: Path | None = None
    ssl_key_password: SecretStr | None = None

    def librdkafka(self) -> dict[str, str]:
        conf: dict[str, str] = {"security.protocol": self.protocol}
        optional: dict[str, str | Path | SecretStr | None] = {
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.certificate.location": self.ssl_certificate_location,
            "ssl.key.location": self.ssl_key_location,
            "ssl.key.password": self.ssl_key_password,
        }
        for key, value in optional.items():
            if isinstance(value, SecretStr):
                conf[key] = value.get_secret_value()
            elif value is not None:
                conf[key] = str(value)
        return conf


RETENTION_MIN_MS = 3_600_000
"""The shortest retention a topic of jobs, dead letters or events may be given."""


class TopicSettings(BaseModel):
    """The topic layout that ``pipeline topics apply`` creates (DESIGN section 3)."""

    model_config = {"extra": "forbid", "hide_input_in_errors": True}

    partitions: int = Field(6, ge=1, description="partitions of each job, retry and deferred topic")
    replication_factor: int = Field(1, ge=1)
    min_insync_replicas: int | None = Field(
        None, ge=1, description="None: replication_factor - 1 (at least 1)"
    )
    jobs_retention_ms: int = Field(7 * DAY_MS, ge=-1)
    dlq_retention_ms: int = Field(14 * DAY_MS, ge=-1)
    events_retention_ms: int = Field(3 * DAY_MS, ge=-1)
    events_partitions: int = Field(3, ge=1)
    retry_delays_s: list[float] = Field(
        default_factory=lambda: [5.0, 30.0, 300.0, 1800.0],
        description="one retry tier topic per delay, in increasing order",
    )

    @field_validator("jobs_retention_ms", "dlq_retention_ms", "events_retention_ms")
    @classmethod
    def _keeps_an_hour(cls, retention_ms: int) -> int:
        # Kafka would delete jobs still waiting, and dead letters no one has seen, as soon as
        # their segment rolls: a typo (0, or seconds for milliseconds) must not do that.
        if retention_ms != -1 and retention_ms < RETENTION_MIN_MS:
            raise ValueError(
                f"must be -1 (keep for ever) or at least {RETENTION_MIN_MS} (an hour), "
                f"got {retention_ms}"
            )
        return retention_ms

    @field_validator("retry_delays_s")
    @classmethod
    def _increasing(cls, delays: list[float]) -> list[float]:
        if any(d <= 0 for d in delays) or delays != sorted(set(delays)):
            raise ValueError("retry delays must be positive and strictly increasing")
        for delay in delays:  # NaN and infinities too: the worker would fail at its start
            delay_s(delay, "a retry delay")
        return delays

    @model_validator(mode="after")
    def _insync_fits(self) -> TopicSettings:
        if (
            self.min_insync_replicas is not None
            and self.min_insync_replicas > self.replication_factor
        ):
            raise ValueError(
                f"min_insync_replicas ({self.min_insync_replicas}) cannot exceed "
                f"replication_factor ({self.replication_factor})"
            )
        return self

    @property
    def effective_min_insync_replicas(self) -> int:
        if self.min_insync_replicas is not None:
            return self.min_insync_replicas
        return max(1, self.replication_factor - 1)


class ProducerSettings(BaseModel):
    """How jobs are produced. The producer is always idempotent with ``acks=all``."""

    model_config = {"extra": "forbid", "hide_input_in_errors": True}

    delivery_timeout_s: float = Field(
        30.0, gt=0, description="how long a job may wait for Kafka before enqueue fails"
    )
    linger_ms: float = Field(
        0.0,
        ge=0,
        description="how long librdkafka waits to fill a batch of single enqueues; 0 sends "
        "each job at once",
    )
    bulk_linger_ms: float = Field(
        5.0,
        ge=0,
        description="the same for enqueue_many, which has its own producer when the two "
        "differ; set it to linger_ms for one producer",
    )
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "lz4"
    default_max_attempts: int = Field(5, ge=1)
    exit_flush_timeout_s: float = Field(
        30.0,
        ge=0,
        description="at interpreter exit, wait this long for unacknowledged jobs, then log "
        "the ones that never reached Kafka at ERROR",
    )


class Settings(RedactedRepr, BaseSettings):
    """Everything configurable, with defaults that run against ``pipeline dev up``."""

    model_config = SettingsConfigDict(
        env_prefix="PIPELINE_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
        hide_input_in_errors=True,
    )

    bootstrap_servers: str = "localhost:9092"
    namespace: str = Field(
        "pipeline", max_length=200, pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"
    )
    """Every topic's prefix: at most 200 characters, so the longest name it makes
    (``<namespace>.scheduler-control``) stays within Kafka's 249."""
    client_id: str = "pipeline"
    security: SecuritySettings = Field(default_factory=SecuritySettings)
    kafka: KafkaOptions = Field(
        default_factory=dict,
        description="librdkafka options passed through as they are (they win over derived ones)",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="the services' log lines: text (key=value after the message) or json "
        "(one object per line)",
    )
    events: Literal["off", "errors", "all"] = Field(
        "errors",
        description="lifecycle events on <ns>.events: none, failures only (retried, dead, "
        "replayed, discarded), or also started, succeeded and progress",
    )
    topics: TopicSettings = Field(default_factory=TopicSettings)
    producer: ProducerSettings = Field(default_factory=ProducerSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    schema_registry: SchemaRegistrySettings = Field(default_factory=SchemaRegistrySettings)
    web: WebSettings = Field(default_factory=WebSettings)

    if not TYPE_CHECKING:  # type checkers keep pydantic's signature, with every field

        def __init__(self, **values: Any) -> None:
            try:
                super().__init__(**values)
            except PydanticSettingsError as exc:  # a list or mapping variable that is not JSON
                raise unreadable_variables(exc, type(self)) from exc

    @model_validator(mode="before")
    @classmethod
    def _without_unused_invalid_sections(cls, data: Any) -> Any:
        scope = unused_scope()
        return scope.checked(cls, data) if scope is not None and isinstance(data, dict) else data

    @field_validator("bootstrap_servers")
    @classmethod
    def _names_a_server(cls, value: str) -> str:
        # An unset variable substituted as "" would otherwise wait for a Kafka that is not
        # named, and then call it unreachable.
        if not any(part.strip() for part in value.split(",")):
            raise ValueError("names no server; give HOST:PORT[,HOST:PORT...]")
        for part in value.split(","):
            port = _port_of(part.strip())
            if port is not None and not (
                port.isascii() and port.isdigit() and 0 < int(port) < 65536
            ):
                # librdkafka reads it as port 0, and the client waits for a broker it never
                # tries, then calls Kafka unreachable.
                raise ValueError(
                    f"{part.strip()!r} has no valid port; give HOST:PORT, a port of 1-65535"
                )
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get("PIPELINE_CONFIG_FILE")
        if config_file:
            sources.append(_toml_source(settings_cls, Path(config_file)))
        return tuple(sources)

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> Settings:
        """Settings from a TOML file; environment variables and ``overrides`` still win."""
        with reading_config_file(path):
            return build_settings(cls, **overrides)

    def client_config(self) -> dict[str, str]:
        """librdkafka options shared by every client: servers, identity, security, passthrough."""
        conf = {"bootstrap.servers": self.bootstrap_servers, "client.id": self.client_id}
        conf.update(self.security.librdkafka())
        conf.update(self.kafka)
        return conf

    @property
    def priorities(self) -> tuple[Priority, ...]:
        return tuple(Priority)


def _toml_source(settings_cls: type[BaseSettings], path: Path) -> PydanticBaseSettingsSource:
    """The settings of the TOML file at ``path``. A path that names no file is an error, not an
    empty file (pydantic skips it): a typo would otherwise run with the defaults, in the
    default namespace."""
    if not path.is_file():
        raise ConfigurationError(
            f"config file {path} (PIPELINE_CONFIG_FILE) does not exist or is not a file"
        )
    try:
        return TomlConfigSettingsSource(settings_cls, toml_file=path)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as exc:
        raise ConfigurationError(f"config file {path} cannot be read as TOML: {exc}") from None


@contextmanager
def reading_config_file(path: str | Path | None) -> Iterator[None]:
    """While inside, settings are read from the TOML file at ``path`` (as if
    ``PIPELINE_CONFIG_FILE`` named it); ``None`` changes nothing."""
    if path is None:
        yield
        return
    path = Path(path)
    if not path.is_file():
        raise ConfigurationError(f"config file {path} does not exist")
    previous = os.environ.get("PIPELINE_CONFIG_FILE")
    os.environ["PIPELINE_CONFIG_FILE"] = str(path)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["PIPELINE_CONFIG_FILE"]
        else:
            os.environ["PIPELINE_CONFIG_FILE"] = previous


def check_config_file() -> None:
    """Raise :class:`ConfigurationError` when ``PIPELINE_CONFIG_FILE`` names a file that is
    missing or not TOML: what a service checks before it imports an application, whose
    ``Pipeline()`` would read the file and fail with a traceback."""
    path = os.environ.get("PIPELINE_CONFIG_FILE")
    if path:
        _toml_source(Settings, Path(path))


def build_settings(cls: type[Settings] | None = None, **overrides: Any) -> Settings:
    """``Settings(**overrides)``, raising :class:`SettingsError` with one readable line per
    bad value instead of pydantic's ``ValidationError`` (the library, the worker, the scheduler
    and the CLI all build their settings through here)."""
    try:
        return (cls or Settings)(**overrides)
    except ValidationError as exc:
        raise settings_error(exc) from exc
