"""Settings of per-tenant fairness in the worker (``worker.tenants.*``,
``PIPELINE_WORKER__TENANTS__*``): the switch, the default weight, and the tenants named with
their own weight, concurrency cap and rate limit (see docs/tenants.md)."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from ._registry import RATE_MAX, RATE_MIN

OTHER_TENANT = "other"
"""The metric label of every tenant not named in the settings (and of jobs without one)."""


class TenantOptions(BaseModel):
    """One named tenant: its share of the starts, and limits that hold fleet-wide."""

    model_config = {"extra": "forbid", "hide_input_in_errors": True, "allow_inf_nan": False}

    weight: float | None = Field(
        None, gt=0, description="its share of the starts against other tenants with jobs "
        "waiting at the same priority; None: the default weight",
    )  # fmt: skip
    concurrency: int | None = Field(
        None, ge=1, description="most of its jobs running at once across the fleet (each worker "
        "takes its share of the partitions, at least 1)",
    )  # fmt: skip
    rate_limit: float | None = Field(
        None, ge=RATE_MIN, le=RATE_MAX, description="most of its jobs started per second across "
        "the fleet (each worker takes its share of the partitions)",
    )  # fmt: skip


class TenantSettings(BaseModel):
    """Fair dispatch across tenants inside each priority, and the tenants named here."""

    model_config = {"extra": "forbid", "hide_input_in_errors": True, "allow_inf_nan": False}

    fairness: bool = Field(
        True, description="start the held jobs of one priority by deficit round robin over "
        "their tenants (False: in the order they were read)",
    )  # fmt: skip
    default_weight: float = Field(1.0, gt=0, description="the weight of a tenant not named")
    named: dict[str, TenantOptions] = Field(
        default_factory=dict, description="tenants with their own weight and limits; the "
        "tenant label of the metrics names these only, the rest are counted as 'other'",
    )  # fmt: skip

    @field_validator("named")
    @classmethod
    def _plain_names(cls, named: dict[str, TenantOptions]) -> dict[str, TenantOptions]:
        for name in named:
            if not name or name == OTHER_TENANT:
                raise ValueError(f"a named tenant needs a name other than '' and {OTHER_TENANT!r}")
            if name != name.strip():
                # A tenant is matched as the producer wrote it: " acme" never meets "acme".
                raise ValueError(
                    f"the named tenant {name!r} has spaces around it: it would match no job of "
                    f"{name.strip()!r}"
                )
        return named

    def weight_of(self, tenant: str | None) -> float:
        options = self.named.get(tenant) if tenant is not None else None
        if options is not None and options.weight is not None:
            return options.weight
        return self.default_weight
