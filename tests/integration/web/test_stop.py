"""``pipeline web`` stops as the worker and the scheduler do: exit 0 after a stop signal."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .conftest import WebFactory

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_ends_the_dashboard_with_exit_0(
    web: WebFactory, stop: signal.Signals
) -> None:
    """uvicorn raises the signal again once it stopped: SIGINT (Ctrl-C) ended the dashboard
    with a traceback, "Aborted!" and exit 1, SIGTERM (Kubernetes) killed it, exit 143."""
    server = web.start()
    server.process.send_signal(stop)
    assert server.process.wait(30) == 0, server.output()
    assert "Traceback" not in server.output()
    assert "Aborted" not in server.output()
