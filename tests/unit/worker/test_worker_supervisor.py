"""``--processes N``: which exits of a child the supervisor restarts."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import pytest

from pipeline_worker import _supervisor
from pipeline_worker._supervisor import Supervisor


@pytest.mark.parametrize("code", [2, 4])
def test_a_child_that_cannot_run_with_its_settings_is_not_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """Exit code 2 (a metrics port it cannot serve, say) and 4 (credentials refused) would only
    come back: the child stays down, and the supervisor exits with that code."""
    child = tmp_path / "child"
    child.write_text(f"#!/bin/sh\nexit {code}\n")
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))
    supervisor = Supervisor({}, 2, None)
    starts: list[int] = []
    start = supervisor._start

    def counted(one: _supervisor._Child) -> None:
        starts.append(one.index)
        start(one)

    monkeypatch.setattr(supervisor, "_start", counted)
    # A supervisor that restarts for ever is stopped, so that the test fails rather than hangs.
    watchdog = threading.Timer(20, supervisor._on_signal, (signal.SIGTERM, None))
    watchdog.start()
    try:
        assert supervisor.run() == code
    finally:
        watchdog.cancel()
    assert sorted(starts) == [0, 1]


def test_a_signal_while_the_children_start_leaves_the_rest_unstarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The children not started yet were marked done, then started all the same, and the
    supervisor returned at once, without waiting for any of them."""
    child = tmp_path / "child"
    child.write_text("#!/bin/sh\nexec sleep 30\n")
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))
    supervisor = Supervisor({}, 2, None)
    starts: list[int] = []
    start = supervisor._start

    def signalled_after_the_first(one: _supervisor._Child) -> None:
        starts.append(one.index)
        start(one)
        supervisor._on_signal(signal.SIGTERM, None)  # arrives while the others still start

    monkeypatch.setattr(supervisor, "_start", signalled_after_the_first)
    watchdog = threading.Timer(20, supervisor._on_signal, (signal.SIGTERM, None))
    watchdog.start()
    try:
        supervisor.run()
    finally:
        watchdog.cancel()
    assert starts == [0]
    first = supervisor._children[0]
    assert first.exit_code == -signal.SIGTERM  # waited for: it exited of the forwarded signal
