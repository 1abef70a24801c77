"""A producer that keeps enqueuing jobs and records which ones Kafka acknowledged.

``python -m tests.faults.produce LOG RATE`` sends ``noop`` jobs (payload ``{"n": i}``) at
``RATE`` per second, in turn to each priority, until SIGTERM; then it stops sending and waits
for the answers to the jobs still in flight (the producer's delivery timeout at most). ``LOG``
gets one line per job as its answer comes: ``A <job id>`` acknowledged, ``F <job id> <error>``
refused or timed out, and at exit ``U <job id>`` for a job never answered. Kafka settings come
from the environment (``PIPELINE_*``), so the process can run on another host (a network
namespace).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import Pipeline, Priority, Settings
from pipeline._errors import PipelineError

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import TextIO

    from pipeline._delivery import JobHandle

_SCAN_S = 0.2


def _settle(pending: list[JobHandle], log: TextIO) -> list[JobHandle]:
    """Writes the answered jobs' lines; returns the jobs still waiting for an answer."""
    waiting = []
    for handle in pending:
        if not handle.done():
            waiting.append(handle)
        elif handle.offset is not None:
            log.write(f"A {handle.job_id}\n")
        else:
            reason = "no error given"
            try:
                handle.wait(0)  # raises what Kafka answered
            except PipelineError as exc:
                reason = " ".join(str(exc).split())
            log.write(f"F {handle.job_id} {reason}\n")
    log.flush()
    return waiting


def _serve(pending: Iterable[JobHandle], seconds: float, stopping: threading.Event) -> None:
    """Serves delivery callbacks for ``seconds`` (through the oldest unanswered job's wait),
    or, with every job answered, waits as long for ``stopping``."""
    first = next((h for h in pending if not h.done()), None)
    if first is None:
        stopping.wait(max(0.0, seconds))
        return
    with contextlib.suppress(PipelineError):  # not answered yet, or refused: _settle tells
        first.wait(max(0.001, seconds))


def run(log_path: Path, rate: float) -> int:
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    settings = Settings()
    app = Pipeline(settings)
    priorities = list(Priority)
    pending: list[JobHandle] = []
    sent = 0
    with log_path.open("a") as log:
        began = time.monotonic()
        scanned = began
        while not stopping.is_set():
            now = time.monotonic()
            due = int((now - began) * rate) + 1
            while sent < due:
                priority = priorities[sent % len(priorities)]
                pending.append(app.submit("noop", {"n": sent}, priority=priority))
                sent += 1
            if now - scanned >= _SCAN_S:
                pending, scanned = _settle(pending, log), now
            _serve(pending, began + due / rate - time.monotonic(), stopping)
        deadline = time.monotonic() + settings.producer.delivery_timeout_s + 10
        while pending and time.monotonic() < deadline:
            _serve(pending, _SCAN_S, stopping)
            pending = _settle(pending, log)
        for handle in pending:
            log.write(f"U {handle.job_id}\n")
    with contextlib.suppress(PipelineError):  # the failures are in the log already
        app.close(1)
    print(f"sent {sent} jobs, {len(pending)} never answered", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(Path(sys.argv[1]), float(sys.argv[2])))
