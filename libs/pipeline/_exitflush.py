"""Jobs still unacknowledged when the interpreter exits: flushed, else reported loudly.

An application that enqueued something is watched from then on (until :meth:`Pipeline.close`);
at exit each one is flushed for at most ``producer.exit_flush_timeout_s``. What Kafka still has
not acknowledged then, or refused without anyone calling ``flush()``, is logged at ERROR with
the jobs' ids. The exit status cannot be changed from here: Python prints and ignores an
exception raised by an ``atexit`` function (``SystemExit`` included), so a script that must exit
non-zero calls ``app.flush()`` (or uses ``with Pipeline() as app:``), which raises instead.

A child process of :mod:`multiprocessing` (a ``Process``, a ``Pool``'s worker) ends with
``os._exit()``, which runs no atexit function: there the flush is one of multiprocessing's own
exit finalizers, which its children do run (see :func:`_hook_multiprocessing`), including a
child that imports this package only once it runs (see :func:`_hook_this_child`).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from ._transport import UNREACHABLE_CODES

if TYPE_CHECKING:
    from ._delivery import PipelineFailure
    from ._settings import Settings


class ExitFlushed(Protocol):
    """What is flushed at exit: an application (:class:`pipeline.Pipeline`)."""

    @property
    def settings(self) -> Settings: ...

    def _flush_at_exit(self) -> None: ...


_log = logging.getLogger("pipeline.producer")
_MAX_IDS = 20
"""Job ids named in the report at most (the rest are counted)."""

_watched: set[ExitFlushed] = set()
_lock = threading.Lock()


def watch(app: ExitFlushed) -> None:
    """Flush ``app`` at interpreter exit (holding it alive: its producer holds the jobs)."""
    with _lock:
        _watched.add(app)


def unwatch(app: ExitFlushed) -> None:
    with _lock:
        _watched.discard(app)


def flush_all() -> None:
    """Flush every watched application; report what did not reach Kafka (the atexit hook)."""
    with _lock:
        apps = list(_watched)
        _watched.clear()
    for app in apps:
        try:
            app._flush_at_exit()
        except Exception:
            _log.exception("flushing the jobs of %r at exit failed", app)


def report_lost(
    app: ExitFlushed,
    failures: Sequence[PipelineFailure],
    unacknowledged: int,
    timeout: float,
    refused: str | None = None,
    *,
    purged: bool = False,
    not_kept: int = 0,
) -> None:
    """Log, at ERROR, the jobs that never reached Kafka (nothing when there are none);
    ``unacknowledged``: what the exit flush left queued, ``refused``: why, when Kafka refused
    the producer's credentials, ``purged``: whether that queue was purged since, ``not_kept``:
    failed jobs whose failures were let go (counted, not named).

    Once the queue is purged, each lost job has a failure naming it, and their number is the
    count told: librdkafka's queue length also counts its pending events (a broker-down error
    not yet served), so it can exceed the jobs by one or two. Unpurged, the queue length is
    all there is to count what is still queued.
    """
    if not failures and not unacknowledged and not not_kept:
        return
    count = len(failures) if purged and failures else max(len(failures), unacknowledged)
    count += not_kept
    ids = [f.job_id for f in failures[:_MAX_IDS]]
    unnamed = len(failures) - len(ids) + not_kept
    more = f" and {unnamed} more" if unnamed else ""
    if refused:
        why = _why("not sent", [refused])
    elif unacknowledged:
        why = _why(f"still unacknowledged {timeout:g}s after exit began", [f.why for f in failures])
    else:
        why = _failed(app.settings, failures) or f"{not_kept} failure(s) not kept"
    _log.error(
        "%d enqueued job(s) never reached Kafka at %s and are lost (%s); job ids: %s%s. "
        "Call app.flush() before exiting: it waits and raises what failed "
        "(see docs/operations.md, 'Enqueued jobs at exit')",
        count,
        app.settings.bootstrap_servers,
        why,
        ", ".join(ids) if ids else "unknown",
        more,
    )


def _why(what: str, reasons: Sequence[str]) -> str:
    """``what`` happened, with up to three of the distinct ``reasons`` librdkafka gave."""
    distinct = sorted(set(reasons))
    return f"{what}: {'; '.join(distinct[:3])}" if distinct else what


def _failed(settings: Settings, failures: Sequence[PipelineFailure]) -> str:
    """Why the delivery reports of ``failures`` failed: their producer failed for good, Kafka
    refused the jobs, or did not acknowledge them within the delivery timeout (which is no
    refusal: it may be down)."""
    fatal = [f.fatal for f in failures if f.fatal is not None]
    told = [f for f in failures if f.fatal is None]
    timed_out = [f.reason for f in told if f.code in UNREACHABLE_CODES]
    refused = [f.reason for f in told if f.code not in UNREACHABLE_CODES]
    timeout = settings.producer.delivery_timeout_s
    parts = [_why("the producer failed for good", fatal)] if fatal else []
    if refused:
        parts.append(_why("refused", refused))
    if timed_out:
        parts.append(
            _why(f"not acknowledged within the delivery timeout of {timeout:g}s", timed_out)
        )
    return "; ".join(parts)


_EXIT_PRIORITY = 100
"""Among multiprocessing's exit finalizers, the flush runs early (higher first), while the
child's other resources (queues, loggers) still work."""


def _hook_multiprocessing() -> None:
    """Make every later child of :mod:`multiprocessing` flush when it ends (once imported).

    Such a child clears the finalizers it inherited, then runs the after-fork functions that
    ``multiprocessing.util`` holds: one of them adds :func:`flush_all` to its finalizers, which
    ``multiprocessing.util._exit_function`` runs before the child's ``os._exit()``.
    """
    util = sys.modules.get("multiprocessing.util")
    if util is not None:  # else no multiprocessing yet: what forks now is not one of its children
        _register_after_fork(util)


@functools.cache
def _register_after_fork(util: ModuleType) -> None:
    """Once per process (a forked child inherits the registration with the cache)."""
    util.register_after_fork(flush_all, _flush_when_the_child_ends)


_finalized_in: int | None = None
"""The process (id) whose multiprocessing finalizers already hold :func:`flush_all`."""


def _flush_when_the_child_ends(flush: Callable[[], None]) -> None:
    """In a new child of multiprocessing: flush at its end, which no atexit function sees.

    Once per process: the after-fork hook and :func:`_hook_this_child` may both ask.
    """
    global _finalized_in  # noqa: PLW0603 - a per-process mark, reset by a fork's new pid
    if _finalized_in == os.getpid():
        return
    import multiprocessing.util

    multiprocessing.util.Finalize(None, flush, exitpriority=_EXIT_PRIORITY)
    _finalized_in = os.getpid()


def _hook_this_child() -> None:
    """This process is a child of multiprocessing that imports the package only now (its
    parent never did, or it was started by ``forkserver`` or ``spawn``): the after-fork
    functions have run already, without :func:`flush_all`, so add it to the finalizers now.

    A ``fork`` or ``forkserver`` child ends with ``os._exit()``: without this, the jobs it
    enqueued were neither flushed nor reported.
    """
    process = sys.modules.get("multiprocessing.process")  # not imported: no such child
    if process is not None and process.parent_process() is not None:
        _flush_when_the_child_ends(flush_all)


def _after_fork_in_child() -> None:
    """A lock a parent's thread held at the fork stays held in the child, where nothing
    would release it (the child's exit flush then hung): the child takes a new one."""
    global _lock  # noqa: PLW0603 - module state, replaced in the forked child only
    _lock = threading.Lock()


# Registered when the package is imported, before any application exists: atexit runs its
# functions last-registered first, so this runs before logging's own shutdown hook.
atexit.register(flush_all)
# multiprocessing forks (``fork``) with its ``util`` module imported; a ``spawn`` or
# ``forkserver`` child imports this package before it starts its target, or inside it.
os.register_at_fork(before=_hook_multiprocessing, after_in_child=_after_fork_in_child)
_hook_multiprocessing()
_hook_this_child()
