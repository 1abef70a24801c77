"""A child started with :func:`death_signal` gets its signal when its parent dies (Linux)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline._deathsignal import death_signal
from tests.waiting import wait_for


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie (an orphan's reaper may be slow to reap it)."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z"


def test_the_child_gets_the_signal_when_its_parent_exits() -> None:
    parent = textwrap.dedent(
        """
        import signal, subprocess
        from pipeline._deathsignal import death_signal
        child = subprocess.Popen(["sleep", "60"], preexec_fn=death_signal(signal.SIGTERM))
        print(child.pid, flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", parent], capture_output=True, text=True, timeout=30, check=True
    )
    pid = int(out.stdout)
    try:
        assert wait_for(lambda: not _alive(pid), 10), "the child outlived its parent"
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_child_whose_parent_died_before_it_asked_kills_itself_before_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between the fork and the call the parent may die: the kernel then never sends the
    signal, so the child checks its parent and ends itself, with a signal that the parent's
    handlers (the child's until its exec) cannot catch: a supervisor catches SIGTERM."""
    monkeypatch.setattr(os, "getppid", lambda: 1)  # as an orphan, adopted by init, sees it
    before = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        child = subprocess.Popen(
            ["sleep", "60"],
            preexec_fn=death_signal(signal.SIGTERM),  # noqa: PLW1509 - one prctl, looked up before
        )
    finally:
        signal.signal(signal.SIGTERM, before)
    try:
        assert child.wait(30) == -signal.SIGKILL
    finally:
        child.kill()
        child.wait()
