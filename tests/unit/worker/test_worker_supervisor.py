"""``--processes N``: which exits of a child the supervisor restarts, and a stop while they
start. The children are shell scripts standing in for ``python -m pipeline_worker``."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline_worker import _signals, _supervisor
from pipeline_worker._supervisor import Supervisor


def supervise(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: str,
    after_start: Callable[[Supervisor], None] = lambda supervisor: None,
    *,
    burst: bool = False,
) -> tuple[Supervisor, int, list[int]]:
    """Run a supervisor of 2 children running ``script``; return it, its exit code and the
    children started, in order. ``after_start`` runs after each start. A supervisor that never
    ends (restarting for ever) is stopped after 20 s, so that a test fails rather than hangs."""
    child = tmp_path / "child"
    child.write_text(f"#!/bin/sh\n{script}\n")
    child.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(child))
    supervisor = Supervisor({}, 2, None, burst=burst)
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


def test_the_backoff_stays_at_its_maximum_after_any_number_of_quick_deaths() -> None:
    """A child crash-looping for hours (a broker down all night) waits the maximum between
    restarts for ever; the backoff's ``2**failures`` once grew too large for a float and the
    supervisor died of an OverflowError after about a thousand deaths."""
    supervisor = Supervisor({}, 1, None)
    child = supervisor._children[0]
    child.process = subprocess.Popen(["sh", "-c", "exit 1"])
    child.process.wait()
    child.failures = 2000
    child.started = time.monotonic()
    supervisor._watch()
    assert child.process is None
    assert not child.done
    assert child.restart_at is not None
    assert child.restart_at - time.monotonic() == pytest.approx(_supervisor.BACKOFF_MAX_S, abs=1)
    assert child.failures == 2001


def test_a_signal_before_the_supervisor_took_over_starts_no_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM recorded by the command's early handler (after its look, before the supervisor
    installed its own) is a stop: no child starts and the command exits 0, rather than
    running until a second signal that an orchestrator never sends."""
    monkeypatch.setattr(_signals._Stops, "first", signal.SIGTERM)
    _, code, starts = supervise(tmp_path, monkeypatch, "exec tail -f /dev/null")
    assert starts == []
    assert code == 0


def test_a_signal_while_a_child_is_being_started_reaches_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal whose handler runs inside ``Popen`` (between fork and the child's assignment)
    is forwarded to that child once it exists, and the supervisor waits for it: the child is
    neither taken for one waiting to restart (marked done, never signalled) nor left running
    after the supervisor returned."""
    real_popen = subprocess.Popen
    supervisors: list[Supervisor] = []
    children: list[subprocess.Popen[bytes]] = []

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        process: subprocess.Popen[bytes] = real_popen(*args, **kwargs)
        children.append(process)
        if len(children) == 1:
            supervisors[0]._on_signal(signal.SIGTERM, None)  # the handler runs here
        return process

    monkeypatch.setattr(subprocess, "Popen", popen)
    original_init = Supervisor.__init__

    def init(self: Supervisor, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        supervisors.append(self)

    monkeypatch.setattr(Supervisor, "__init__", init)
    try:
        supervisor, code, starts = supervise(tmp_path, monkeypatch, "exec tail -f /dev/null")
    finally:
        for process in children:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert starts == [0]  # the second child stays unstarted
    assert children[0].returncode == -signal.SIGTERM  # signalled, and waited for
    assert supervisor._children[0].exit_code == -signal.SIGTERM
    # Killed by the stop before it could handle the signal: it ran nothing, a clean stop.
    assert code == 0


def test_a_burst_child_that_gives_up_is_not_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst run exits 1 when it gives up (Kafka down, topics missing): under --processes it
    was restarted for ever, where a single process's run ends."""
    _, exit_code, starts = supervise(tmp_path, monkeypatch, "exit 1", burst=True)
    assert exit_code == 1
    assert sorted(starts) == [0, 1]


def test_a_second_stop_exits_130_as_one_worker_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its children exit at once with 130 on a second signal; the supervisor said 1, which the
    exit codes give to a failure (Kafka unreachable and such)."""

    def stop_twice(supervisor: Supervisor) -> None:
        if all(child.process for child in supervisor._children):
            for delay in (0.3, 1.6):  # two requests, not one repeated within a second
                timer = threading.Timer(delay, supervisor._on_signal, (signal.SIGTERM, None))
                timer.start()

    _, code, _ = supervise(
        tmp_path,
        monkeypatch,
        "trap 'trap \"exit 130\" TERM' TERM; while :; do sleep 0.05; done",
        stop_twice,
    )
    assert code == 130


def test_a_stop_by_sigterm_then_sigint_exits_130_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child the first signal (SIGTERM) killed as it started counted as clean only if the
    last signal was SIGTERM too: after a SIGINT, the command said 1."""

    def term_then_int(supervisor: Supervisor) -> None:
        if all(child.process for child in supervisor._children):
            for delay, signum in ((0.3, signal.SIGTERM), (1.6, signal.SIGINT)):
                timer = threading.Timer(delay, supervisor._on_signal, (signum, None))
                timer.start()

    supervisor, code, _ = supervise(
        tmp_path,
        monkeypatch,
        # Child 1 has no handler yet (killed by SIGTERM); child 0 exits 130 at the SIGINT.
        'case "$*" in *"--child-index 1"*) while :; do sleep 0.05; done;; esac; '
        "trap 'trap \"exit 130\" INT' TERM; while :; do sleep 0.05; done",
        term_then_int,
    )
    assert sorted(c.exit_code or 0 for c in supervisor._children) == [-signal.SIGTERM, 130]
    assert code == 130
