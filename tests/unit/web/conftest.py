"""What the dashboard's unit tests share: a clock a test moves, and dashboards that never read
their namespace (the monitor's thread is not started), closed after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import pytest

from pipeline import Settings
from pipeline_web import create_app
from pipeline_web._security import Gate

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from pipeline_web._dashboard import Dashboard

T0 = 1_800_000_000.0


class FakeClock:
    """Stands for :func:`time.time` or :func:`time.monotonic`: it says ``now``, which a test
    moves."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class MakeDashboard(Protocol):
    def __call__(
        self, namespace: str, *, clock: Callable[[], float] | None = None, **web: object
    ) -> Starlette: ...


@pytest.fixture
def make_dashboard(monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeDashboard]:
    """``make_dashboard(namespace, clock=None, **web)``: the application of a dashboard of
    ``web`` settings (its gate reading ``clock`` when given)."""
    made: list[Dashboard] = []

    def make(
        namespace: str, *, clock: Callable[[], float] | None = None, **web: object
    ) -> Starlette:
        settings = Settings(bootstrap_servers="127.0.0.1:1", namespace=namespace, web=web)
        application = create_app(settings, timeout=0.5)
        found: Dashboard = application.state.dashboard
        monkeypatch.setattr(found.monitor, "start", lambda: None)
        if clock is not None:
            found.gate = Gate(settings.web, clock=clock)
        made.append(found)
        return application

    yield make
    for found in made:
        found.monitor.stop()
        found.letters.close()
