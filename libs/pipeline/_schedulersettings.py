"""Settings of ``pipeline-scheduler`` (``scheduler.*``): delayed jobs, cron, leadership."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator


class SchedulerSettings(BaseModel):
    """How ``pipeline-scheduler`` holds delayed jobs, fires cron schedules and elects a leader."""

    model_config = {"extra": "forbid", "hide_input_in_errors": True}

    horizon_s: float = Field(
        120.0, gt=0, description="jobs due within this many seconds wait in memory"
    )
    wait_tiers_s: list[float] = Field(
        default_factory=lambda: [60.0, 600.0, 3600.0, 21600.0],
        description="fixed delays of the <ns>.deferred.<n> wait tiers, increasing; the "
        "smallest must be at most half the horizon",
    )
    session_timeout_ms: int = Field(
        1500,
        ge=1000,
        description="a standby takes over this long after the leader dies; below 6000 the "
        "brokers' group.min.session.timeout.ms must allow it (else the nearest allowed is used)",
    )
    release_lead_ms: int = Field(
        200,
        ge=0,
        le=2000,
        description="release a delayed job this long before it is due, so that its transaction "
        "has committed by then; the worker holds it until its not_before",
    )
    batch_max: int = Field(5000, ge=1, description="releases per transaction at most")
    max_wait_s: float = Field(0.5, gt=0, description="longest sleep between two loop turns")
    partitions_check_s: float = Field(
        30.0,
        gt=0,
        description="how often the leader asks whether its topics gained partitions (a new "
        "term then reads them)",
    )
    misfire_grace_s: float = Field(
        60.0, ge=0, description="a cron fire this late is late, not missed: it always fires"
    )
    max_catchup_fires: int = Field(
        1000,
        ge=1,
        description="missed='all' enqueues at most this many missed fires (the newest), and a "
        "loop step at most this many fires of one schedule (a catch-up goes on at the next)",
    )
    group_id: str | None = Field(None, description="leadership group; None: '<ns>.scheduler'")
    transactional_id: str | None = Field(None, description="None: '<ns>.scheduler'")
    metrics_port: int | None = Field(None, ge=0, le=65535)
    unhealthy_after_s: float = Field(
        30.0, gt=0, description="/healthz answers 503 once Kafka has been unreachable this long"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("wait_tiers_s")
    @classmethod
    def _tiers_increasing(cls, delays: list[float]) -> list[float]:
        if any(d <= 0 for d in delays) or delays != sorted(set(delays)):
            raise ValueError("wait tier delays must be positive and strictly increasing")
        return delays

    @model_validator(mode="after")
    def _tiers_fit_horizon(self) -> SchedulerSettings:
        if self.wait_tiers_s and self.wait_tiers_s[0] > self.horizon_s / 2:
            raise ValueError(
                f"the smallest wait tier ({self.wait_tiers_s[0]:g}s) must be at most half the "
                f"horizon ({self.horizon_s:g}s), so that every job beyond the horizon fits a tier"
            )
        return self
