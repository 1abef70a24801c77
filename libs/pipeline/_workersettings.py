"""Settings of ``pipeline-worker`` (``worker.*``): consuming, running and committing jobs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from ._dedup import TTL_MAX_S, DedupScope
from ._job import Priority
from ._kafkaoptions import KafkaOptions
from ._redact import RedactedRepr
from ._tenantsettings import TenantSettings


class WorkerSettings(RedactedRepr, BaseModel):
    """How ``pipeline-worker`` consumes and runs jobs (flags of the same names override these)."""

    model_config = {"extra": "forbid", "hide_input_in_errors": True}

    group_id: str | None = Field(None, description="consumer group; None: '<namespace>.workers'")
    priorities: list[Priority] = Field(default_factory=lambda: list(Priority))
    policy: Literal["strict", "weighted"] = "weighted"
    weights: list[int] = Field(default_factory=lambda: [10, 5, 3, 1])
    concurrency: int = Field(64, ge=1, description="jobs in flight per process")
    threads: int | None = Field(
        None,
        ge=1,
        description="most threads for plain-function handlers (on demand); None: concurrency",
    )
    processes: int = Field(1, ge=1)
    buffer_size: int = Field(2000, ge=1, description="jobs buffered per partition before pausing")
    commit_interval_s: float = Field(
        0.05,
        gt=0,
        description="commit the partitions whose commit point or finished offsets changed this "
        "often: after a crash, the jobs finished within the last interval run again",
    )
    commit_every: int = Field(5000, ge=1, description="also commit after this many finished jobs")
    offset_metadata_max_bytes: int = Field(
        4096,
        ge=1024,
        description="the cluster's offset.metadata.max.bytes: each commit's metadata, with the "
        "finished offsets above the commit point, stays within it",
    )
    shutdown_timeout_s: float = Field(30.0, ge=0)
    revoke_grace_s: float = Field(10.0, ge=0)
    metrics_port: int | None = Field(None, ge=0, le=65535)
    unhealthy_after_s: float = Field(
        30.0,
        gt=0,
        description="/healthz answers 503, and a --burst run exits 1, once Kafka has been "
        "unreachable this long",
    )
    max_poll_interval_ms: int = Field(300_000, ge=1)
    session_timeout_ms: int = Field(
        10_000,
        ge=1,
        description="a dead worker's partitions move this long after it dies; a live worker "
        "whose heartbeats (every second, from librdkafka's own thread) stop this long loses them",
    )
    group_protocol: Literal["consumer", "classic"] = Field(
        "consumer",
        description="'consumer' (KIP-848: the session timeout is a group config) or 'classic'",
    )
    key_ordering: bool = Field(
        False, description="jobs with the same Kafka key never run concurrently, in offset order"
    )
    burst: bool = Field(False, description="exit 0 once every assigned partition is drained")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    consume_batch: int = Field(
        1000, ge=1, le=100_000, description="messages taken from the consumer per poll at most"
    )
    kafka_consumer: KafkaOptions = Field(
        default_factory=dict,
        description="librdkafka options for the worker's consumer only (they win over all others)",
    )
    transaction_timeout_ms: int = Field(
        10_000,
        ge=1000,
        description="a worker that dies inside a transaction holds back read_committed readers "
        "of the topics it wrote (retry tiers, DLQ, priority topics) at most this long",
    )
    retries: bool = Field(
        True, description="also move due jobs from the retry tiers back to their priority topics"
    )
    poison_deliveries: int = Field(
        3,
        ge=0,
        description="dead-letter a job that killed its worker this many times running alone "
        "on its partition (0: never)",
    )
    dedup_ttl_s: float = Field(
        3600.0,
        gt=0,
        le=TTL_MAX_S,
        description="seconds an idempotency key is held, for job types that name no dedup_ttl "
        "(at most 1000 years)",
    )
    dedup_scope: DedupScope = Field(
        DedupScope.NAMESPACE,
        description="where an idempotency key keeps duplicates out: namespace (every priority "
        "topic; needs a co-partitioning assignor, range) or priority (each priority topic)",
    )
    dedup_restore_timeout_s: float = Field(
        120.0,
        gt=0,
        le=86_400,
        description="an assigned partition's idempotency keys must be read back within this",
    )
    heartbeat_interval_s: float = Field(
        5.0,
        ge=0,
        description="publish this process's in-flight jobs and utilization on <ns>.workers "
        "this often (pipeline status shows them); 0: never",
    )
    tenants: TenantSettings = Field(
        default_factory=TenantSettings,
        description="fair dispatch across tenants, and per-tenant weights and limits",
    )

    @field_validator("priorities")
    @classmethod
    def _distinct_priorities(cls, priorities: list[Priority]) -> list[Priority]:
        if not priorities or len(set(priorities)) != len(priorities):
            raise ValueError(
                f"priorities must be a non-empty list without repeats, got {priorities}"
            )
        return priorities

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_log_level(cls, level: object) -> object:
        return level.upper() if isinstance(level, str) else level

    @model_validator(mode="after")
    def _weights_match(self) -> WorkerSettings:
        if len(self.weights) != len(Priority) or any(w < 1 for w in self.weights):
            raise ValueError(
                f"weights need one positive integer per priority ({len(Priority)}), "
                f"got {self.weights}"
            )
        return self
