"""The commands' last step: end the process with its exit code, without the interpreter's
finalization.

When a command is done (a worker's stop complete: offsets committed, group left, hooks run),
what is left is the interpreter's own exit: the ``atexit`` functions (an application's jobs
still unacknowledged are flushed there, see :mod:`._exitflush`), then finalization, then the C
library's exit handlers. Those last two race any Kafka client still alive: one whose close the
stop left behind (its budget spent), or one whose last reference goes only at finalization,
keeps librdkafka's threads running, and over TLS OpenSSL's cleanup, one of those exit handlers,
frees what they use. The process then dies of SIGSEGV or SIGABRT after a complete stop, and its
exit code is lost: a worker refused by Kafka (exit 4) did so about once in 50 starts under load.
So the commands run the ``atexit`` functions, flush their streams and end with ``os._exit``.
Threads still running then end with the process, as a daemon thread does at any exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = ["run_then_end"]


def run_then_end(command: Callable[[], object]) -> NoReturn:
    """Run ``command`` (a click command in standalone mode, which ends by raising
    ``SystemExit``), then end the process with its exit code (see the module docstring).
    Any other exception is the interpreter's to report, as usual."""
    try:
        command()
    except SystemExit as exc:
        end(_code_of(exc))
    end(0)


def end(code: int) -> NoReturn:
    """Run the ``atexit`` functions, flush stdout and stderr, and end with ``code``."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, or a pipe whose reader is gone
            stream.flush()
    os._exit(code)


def _code_of(exc: SystemExit) -> int:
    """The exit status the interpreter would give ``exc``: None is 0, a message is printed
    to stderr and is 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1
