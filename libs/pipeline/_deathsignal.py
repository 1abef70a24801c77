"""A child process that gets a signal when the process that started it dies (Linux).

For ``subprocess.Popen(preexec_fn=...)``: everything is looked up in the parent, so the forked
child only makes one system call (importing or loading a library between fork and exec can
deadlock). A parent that dies before the child has asked (between the fork and the call) would
leave it running for good, so the child checks that its parent is still the one that forked it,
and kills itself otherwise (SIGKILL: until the exec it runs the parent's signal handlers, which
may catch any other signal, and nothing of its own has started yet).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

__all__ = ["death_signal"]

PR_SET_PDEATHSIG = 1


def death_signal(sig: signal.Signals) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child get ``sig`` when its parent thread dies; None where
    the platform has no such call (the child then outlives its parent)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    getppid, getpid, kill, number = os.getppid, os.getpid, os.kill, int(sig)

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, number)
        if getppid() != parent:  # the parent died before the call: nobody will signal us
            kill(getpid(), signal.SIGKILL)

    return in_child
