"""``--processes N``: which exits of a child the supervisor restarts, and a stop while they
start. The children are shell scripts standing in for ``python -m pipeline_worker``."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline_worker import _supervisor
from pipeline_worker._supervisor import Supervisor


def supervise(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: str,
    after_start: Callable[[Supervisor], None] = lambda supervisor: None,
) -> tuple[Supervisor, int, list[int]]:
    """Run a supervisor of 2 children running ``script``; return it, its exit code and the
    children started, in order. ``after_start`` runs after each start. A supervisor that never
    ends (restarting for ever) is stopped after 20 s, so that a test fails rather than hangs."""
    child = tmp_path / "child"
    child.write_text(f"#!/bin/sh\n{script}\n")
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))
    supervisor = Supervisor({}, 2, None)
    starts: list[int] = []
    start = supervisor._start

    def counted(one: _supervisor._Child) -> None:
        starts.append(one.index)
        start(one)
        after_start(supervisor)

    monkeypatch.setattr(supervisor, "_start", counted)
    watchdog = threading.Timer(20, supervisor._on_signal, (signal.SIGTERM, None))
    watchdog.start()
    try:
        code = supervisor.run()
    finally:
        watchdog.cancel()
    return supervisor, code, starts


@pytest.mark.parametrize("code", [2, 4])
def test_a_child_that_cannot_run_with_its_settings_is_not_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """Exit code 2 (a metrics port it cannot serve, say) and 4 (credentials refused) would only
    come back: the child stays down, and the supervisor exits with that code."""
    _, exit_code, starts = supervise(tmp_path, monkeypatch, f"exit {code}")
    assert exit_code == code
    assert sorted(starts) == [0, 1]


def test_a_signal_while_the_children_start_leaves_the_rest_unstarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The children not started yet were marked done, then started all the same, and the
    supervisor returned at once, without waiting for any of them."""

    def signalled(supervisor: Supervisor) -> None:
        supervisor._on_signal(signal.SIGTERM, None)  # arrives while the others still start

    supervisor, _, starts = supervise(tmp_path, monkeypatch, "exec tail -f /dev/null", signalled)
    assert starts == [0]
    first = supervisor._children[0]
    assert first.exit_code == -signal.SIGTERM  # waited for: it exited of the forwarded signal
