"""``--processes N``: run N worker processes (N group members) and keep them running.

Each child is a fresh interpreter running ``python -m pipeline_worker`` with the same options
(re-exec rather than fork: librdkafka's threads do not survive a fork). A child that dies (exit
code other than 0, or a signal) is restarted after a backoff that doubles per quick death, from
1 s up to 30 s. SIGTERM/SIGINT to the parent are forwarded to every child; the parent exits
once all children have. Children run in their own process group, so a Ctrl-C in a terminal
reaches them once (through the parent), not twice (which would make them exit at once).
A child that exits 4 (Kafka refused the credentials) is not restarted: its siblings have the
same settings, and the parent exits 4 too once they have, for the orchestrator to show. Nor,
under ``--burst``, one that exits 1: a burst run that gave up (Kafka down, topics missing) is
over, as a single process's is. A child that a stop killed while it started (before it could
handle the signal) stopped cleanly: it had run nothing.
A stop signal is never lost: one that came before the supervisor took over the handlers (the
command records it from its first line) starts no child, and one that comes while a child is
being started reaches that child as soon as it exists.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from pipeline._deathsignal import death_signal
from pipeline._errors import ConfigurationError, KafkaAuthenticationError

from . import _signals

_log = logging.getLogger("pipeline.worker.supervisor")

BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 30.0
_BACKOFF_DOUBLINGS = 16
"""More doublings than any backoff needs to reach the maximum: ``2**failures`` itself, after
a thousand quick deaths (some hours at the maximum), is too large for a float."""
STABLE_AFTER_S = 60.0
"""A child that ran this long before dying restarts after the shortest backoff again."""
CHECK_INTERVAL_S = 0.2
REFUSED = KafkaAuthenticationError.exit_code
USAGE = ConfigurationError.exit_code
"""A child's exit code for settings it cannot run with (a metrics port it cannot serve...)."""
FINAL = (0, REFUSED, USAGE)
"""Exit codes a restart would only repeat: the child stays down."""

# Click parameter name -> command-line flag, to pass the parent's options to its children.
FLAGS = {
    "app_spec": "--app",
    "group_id": "--group",
    "priorities": "--priorities",
    "policy": "--policy",
    "weights": "--weights",
    "concurrency": "--concurrency",
    "threads": "--threads",
    "burst": "--burst",
    "key_ordering": "--key-ordering",
    "bootstrap_servers": "--bootstrap-servers",
    "namespace": "--namespace",
    "log_level": "--log-level",
    "config_file": "--config",
}


def child_arguments(given: Mapping[str, Any]) -> list[str]:
    """The options given to the parent, as arguments for a child (without ``--processes``)."""
    args: list[str] = []
    for name, flag in FLAGS.items():
        if name not in given or given[name] is None:
            continue
        value = given[name]
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif isinstance(value, list | tuple):
            args += [flag, ",".join(str(v) for v in value)]
        elif isinstance(value, Path):
            args += [flag, str(value.resolve())]
        else:
            args += [flag, str(value)]
    return args


@dataclass(eq=False)
class _Child:
    index: int
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    exit_code: int | None = None
    done: bool = False
    extra: list[str] = field(default_factory=list)


class Supervisor:
    """Starts, watches, restarts and stops the worker processes."""

    def __init__(
        self,
        given: Mapping[str, Any],
        processes: int,
        metrics_port: int | None,
        *,
        burst: bool = False,
    ) -> None:
        base = child_arguments(given)
        self._final = (*FINAL, 1) if burst else FINAL
        self._children = []
        for index in range(processes):
            extra = ["--child-index", str(index)]
            if metrics_port is not None:
                port = metrics_port + index if metrics_port else 0
                extra += ["--metrics-port", str(port)]
            self._children.append(_Child(index, extra=base + extra))
        self._stopping = 0
        self._signal: int | None = None
        self._received: set[int] = set()
        """Every stop signal received (a first SIGTERM, then a SIGINT, say)."""
        self._starting: _Child | None = None

    def run(self) -> int:
        """Supervise until every child exited; 0 when all of them exited cleanly."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        if _signals.received():  # came after the command's look, before these handlers
            self._on_signal(signal.SIGTERM, None)
        try:
            for child in self._children:
                if not child.done:  # a signal while the others started: it stays unstarted
                    self._start(child)
            while not all(c.done for c in self._children):
                self._watch()
                time.sleep(CHECK_INTERVAL_S)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        # A child a stop kept from starting has no exit code: it did nothing, which is no failure.
        # One the stop's signal killed as it started (before its handlers) did nothing either.
        stopped = {-signum for signum in self._received}
        codes = [
            0 if c.exit_code in stopped else c.exit_code
            for c in self._children
            if c.exit_code is not None
        ]
        _log.info("all worker processes exited", extra={"exit_codes": codes})
        for final in (REFUSED, USAGE):
            if final in codes:
                return final
        # A second stop: the children exited at once, without committing, as one worker does
        # (130), which is no failure of theirs.
        interrupted = _signals.EXIT_INTERRUPTED
        if self._stopping >= 2 and interrupted in codes and set(codes) <= {0, interrupted}:
            return interrupted
        return 0 if all(code == 0 for code in codes) else 1

    def _start(self, child: _Child) -> None:
        command = [sys.executable, "-m", "pipeline_worker", *child.extra]
        self._starting = child  # a signal meanwhile must not take it for one waiting to restart
        try:
            child.process = subprocess.Popen(
                command,
                process_group=0,
                preexec_fn=death_signal(signal.SIGTERM),  # noqa: PLW1509 - one prctl, looked up before
            )
        finally:
            self._starting = None
        child.started = time.monotonic()
        child.restart_at = None
        if self._signal is not None:  # arrived while it was being started: forward it now
            child.process.send_signal(self._signal)
        _log.info("worker process started", extra={"index": child.index, "pid": child.process.pid})

    def _watch(self) -> None:
        now = time.monotonic()
        for child in self._children:
            if child.done:
                continue
            if child.process is None:
                if child.restart_at is not None and now >= child.restart_at and not self._stopping:
                    self._start(child)
                continue
            code = child.process.poll()
            if code is None:
                continue
            child.process = None
            child.exit_code = code
            if code in self._final or self._stopping:
                child.done = True  # a restart with the same credentials or settings fails again
                if code != 0 and not self._stopping:
                    _log.error(
                        "worker process exited with exit code %d: not restarted (a restart "
                        "would only fail again); the others go on", code,
                        extra={"index": child.index},
                    )  # fmt: skip
                continue
            if now - child.started >= STABLE_AFTER_S:
                child.failures = 0
            delay = min(BACKOFF_MAX_S, BACKOFF_MIN_S * 2 ** min(child.failures, _BACKOFF_DOUBLINGS))
            child.failures += 1
            child.restart_at = now + delay
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            _log.warning(
                "worker process died (%s); restarting in %gs",
                how,
                delay,
                extra={"index": child.index, "restarts": child.failures},
            )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping += 1
        self._signal = signum
        self._received.add(signum)
        name = signal.Signals(signum).name
        _log.info("%s received: forwarding to the worker processes", name)
        for child in self._children:
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signum)
            elif child.process is None and child is not self._starting:
                child.done = True  # waiting for a restart: stay down
