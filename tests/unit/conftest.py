"""Unit tests see the settings' defaults, whatever ``PIPELINE_*`` the shell exports (such as a
``PIPELINE_BOOTSTRAP_SERVERS`` naming the cluster the integration tests use)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _default_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("PIPELINE_")]:
        monkeypatch.delenv(name)
