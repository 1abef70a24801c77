"""Settings of ``pipeline web``, the dashboard (``web.*``, ``PIPELINE_WEB__*``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator


class WebSettings(BaseModel):
    """Where the dashboard listens, who may use it, and what it may change.

    Without credentials it serves loopback clients only, asking for it by a loopback name or
    one of ``allowed_hosts``: ``pipeline web`` refuses another ``host`` unless ``token`` or
    ``username`` and ``password`` are set. Secrets are never rendered or logged.
    """

    model_config = {"extra": "forbid", "hide_input_in_errors": True}

    host: str = Field("127.0.0.1", description="the address to listen on")
    port: int = Field(8180, ge=0, le=65535, description="the port to listen on (0: any free one)")
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="without credentials, host names the dashboard also answers to (the Host "
        "header) besides localhost and loopback addresses; any other is refused, so that a web "
        "page cannot reach the dashboard by rebinding its own name to 127.0.0.1",
    )
    token: SecretStr | None = Field(
        None,
        description="a bearer token: `Authorization: Bearer <token>`, or given once at /login",
    )
    session_max_age_s: int = Field(
        12 * 3600,
        ge=60,
        description="how long the session cookie a token earns at /login lasts, in seconds: "
        "past it the browser asks for the token again",
    )
    username: str | None = Field(None, description="HTTP basic credentials: the user name")
    password: SecretStr | None = Field(None, description="HTTP basic credentials: the password")
    read_only: bool = Field(
        False, description="hide every action: no replay, discard, pause, resume or trigger"
    )
    audit_log: Path | None = Field(
        None,
        description="also append every action as one JSON line to this file (they are always "
        "logged on the pipeline.web.audit logger)",
    )
    refresh_s: float = Field(
        2.0, ge=0.2, description="how often the dashboard reads the namespace's status"
    )
    history_s: float = Field(
        600.0, ge=10, description="how far back the overview's charts of jobs in and out go"
    )
    page_size: int = Field(50, ge=1, le=1000, description="dead letters per page")

    @field_validator("allowed_hosts")
    @classmethod
    def _lower_case(cls, hosts: list[str]) -> list[str]:
        return [host.lower() for host in hosts]  # host names compare without case

    @field_validator("token", "username", "password")
    @classmethod
    def _not_empty(cls, value: SecretStr | str | None) -> SecretStr | str | None:
        # An unset secret (PIPELINE_WEB__TOKEN=$(cat missing-file)) is empty, and would let
        # anyone in who sends it: refuse it rather than serve with no credentials at all.
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if text is not None and not text.strip():
            raise ValueError("must not be empty (leave it unset for no credentials)")
        return value

    @model_validator(mode="after")
    def _both_basic_credentials(self) -> WebSettings:
        if (self.username is None) != (self.password is None):
            raise ValueError("web.username and web.password go together: set both or neither")
        return self

    @property
    def auth_enabled(self) -> bool:
        return self.token is not None or self.username is not None
