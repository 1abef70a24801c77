"""Unit tests see the settings' defaults, whatever ``PIPELINE_*`` the shell exports (such as a
``PIPELINE_BOOTSTRAP_SERVERS`` naming the cluster the integration tests use)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline._transport import _stop_pollers
from pipeline.outbox import create_table


@pytest.fixture(autouse=True)
def _default_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("PIPELINE_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def database(tmp_path: Path) -> Path:
    """A SQLite database with the outbox table, for the outbox's tests."""
    path = tmp_path / "service.db"
    with sqlite3.connect(path) as connection:
        create_table(connection)
    return path


@pytest.fixture(autouse=True)
def _no_producer_polling_after_the_test() -> Iterator[None]:
    """The thread serving a producer the test left open stops with the test: it would serve
    (and log) that producer's callbacks during the next tests."""
    yield
    _stop_pollers()
