"""The tenants named in the settings: names a job can carry, and nothing else."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipeline._tenantsettings import TenantSettings


def test_a_named_tenant_keeps_its_options() -> None:
    settings = TenantSettings.model_validate({"named": {"acme": {"weight": 3, "concurrency": 2}}})
    assert settings.weight_of("acme") == 3
    assert settings.weight_of("globex") == settings.default_weight
    assert settings.named["acme"].concurrency == 2


@pytest.mark.parametrize("name", ["", "other"])
def test_the_empty_name_and_the_label_of_the_rest_are_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="a named tenant needs a name other than"):
        TenantSettings.model_validate({"named": {name: {"weight": 2}}})


@pytest.mark.parametrize("name", [" acme", "acme ", "acme\t", "\nacme"])
def test_a_name_with_spaces_around_it_is_refused_as_it_would_match_no_job(name: str) -> None:
    # From a TOML file (`[worker.tenants.named." acme"]`) or an environment variable, a stray
    # space made a tenant whose weight and limits silently never applied to "acme".
    with pytest.raises(
        ValidationError, match="has spaces around it: it would match no job of 'acme'"
    ):
        TenantSettings.model_validate({"named": {name: {"weight": 2}}})


@pytest.mark.parametrize("rate", [5e-324, 1e308])
def test_a_tenant_rate_a_worker_cannot_keep_is_refused(rate: float) -> None:
    with pytest.raises(ValidationError, match="rate_limit"):
        TenantSettings.model_validate({"named": {"acme": {"rate_limit": rate}}})
