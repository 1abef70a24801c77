"""The job application the benchmark's workers run (``pipeline-worker --app ops.bench.app``).

Handlers stay as close to no-ops as possible; what they record goes to the file named by
``BENCH_RECORD`` (one ``os.write`` per line, ``O_APPEND``):

* ``bench.noop`` writes ``first <ns>`` on its first run in a process and ``last <ns>`` on run
  number ``BENCH_EXPECTED``, which gives the first-to-last-job time of a drain;
* ``bench.forward`` enqueues a ``bench.noop`` job into the namespace ``BENCH_SINK_NAMESPACE``
  (a follow-up), then writes as ``bench.noop`` does;
* ``bench.latency`` writes ``<start ns - enqueue ns>`` for every job;
* ``bench.due`` writes ``<start ns - not_before ns>`` for every job (a delayed job's lateness);
* ``bench.counted`` writes ``S <n> <ns>`` when it starts and ``E <n> <ns>`` when it ends, after
  ``ms`` milliseconds (which jobs ran, how often, which were running at a moment);
* ``bench.wait`` (awaits ``ms`` milliseconds, as a handler waiting on a network call does) and
  ``bench.cpu`` (computes for ``us`` microseconds, holding the GIL) write ``<pid> <ns>`` when
  they end (the rate of several worker processes together, and each one's share).
* ``bench.stamped`` writes ``R <pid> <ns>`` when it starts (which worker ran jobs when);
* ``bench.placed`` writes ``P <pid> <topic> <partition> <ns>`` when it starts (which worker ran
  jobs of which partition when);
* ``bench.tenant`` writes ``<tenant> <ns> <start ns - enqueue ns>`` when it starts, then awaits
  ``ms`` milliseconds (whose jobs waited how long behind whose).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import threading
import time

from pipeline import JobContext, Pipeline

RECORD_ENV = "BENCH_RECORD"
EXPECTED_ENV = "BENCH_EXPECTED"
SINK_ENV = "BENCH_SINK_NAMESPACE"

app = Pipeline()

_runs = itertools.count(1)  # next() on a count is atomic under the GIL: safe across threads
_fd: int | None = None
_expected = int(os.environ.get(EXPECTED_ENV, "0"))
"""Read once: looking the environment up on every call would cost the handler a microsecond."""


def _write(line: str) -> None:
    global _fd  # noqa: PLW0603 - one file per worker process, opened on first use
    if _fd is None:
        _fd = os.open(os.environ[RECORD_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, line.encode())


@app.job("bench.noop")
def noop(n: int) -> None:
    """Nothing, but note the first and the last (``BENCH_EXPECTED``-th) run."""
    run = next(_runs)
    if run == 1:
        _write(f"first {time.time_ns()}\n")
    if run == _expected:
        _write(f"last {time.time_ns()}\n")


_sinks: list[Pipeline] = []
_sink_lock = threading.Lock()


def _sink() -> Pipeline:
    """The application of namespace ``BENCH_SINK_NAMESPACE`` (made on first use)."""
    if not _sinks:
        with _sink_lock:
            if not _sinks:
                namespace = os.environ[SINK_ENV]
                _sinks.append(Pipeline(app.settings.model_copy(update={"namespace": namespace})))
    return _sinks[0]


@app.job("bench.forward")
def forward(n: int) -> None:
    """Enqueue ``bench.noop`` job ``n`` into ``BENCH_SINK_NAMESPACE`` (a follow-up), then note
    the first and last run as ``bench.noop`` does."""
    _sink().enqueue("bench.noop", {"n": n})
    noop(n)


@app.job("bench.latency")
def latency(n: int, t: int) -> None:
    """Note how long ago, in nanoseconds, the job was enqueued (``t``: ``time.time_ns()``)."""
    _write(f"{time.time_ns() - t}\n")


@app.job("bench.due")
def due(n: int, ctx: JobContext) -> None:
    """Note how late, in nanoseconds, the job started after its ``not_before``."""
    _write(f"{time.time_ns() - (ctx.job.not_before or 0) * 1_000_000}\n")


@app.job("bench.counted")
def counted(n: int, ms: float = 0.0) -> None:
    """Note the start and the end of every run of job ``n``, ``ms`` milliseconds apart."""
    _write(f"S {n} {time.time_ns()}\n")
    if ms:
        time.sleep(ms / 1000)
    _write(f"E {n} {time.time_ns()}\n")


def _done() -> None:
    _write(f"{os.getpid()} {time.time_ns()}\n")


@app.job("bench.wait")
async def wait(n: int, ms: float) -> None:
    """Wait ``ms`` milliseconds without holding a thread (a call to another service)."""
    await asyncio.sleep(ms / 1000)
    _done()


@app.job("bench.cpu")
def cpu(n: int, us: float) -> None:
    """Hash for ``us`` microseconds: Python work that holds the GIL."""
    until = time.perf_counter_ns() + int(us * 1000)
    block = n.to_bytes(8, "little") * 8
    while time.perf_counter_ns() < until:
        block = hashlib.blake2b(block).digest()
    _done()


@app.job("bench.stamped")
def stamped(n: int, ms: float = 0.0) -> None:
    """Note which process started job ``n``, and when: ``R <pid> <ns>``; then sleep ``ms``."""
    _write(f"R {os.getpid()} {time.time_ns()}\n")
    if ms:
        time.sleep(ms / 1000)


@app.job("bench.placed")
def placed(n: int, ctx: JobContext) -> None:
    """Note which process started job ``n``, from which partition, and when."""
    _write(f"P {os.getpid()} {ctx.topic} {ctx.partition} {time.time_ns()}\n")


@app.job("bench.tenant")
async def tenant(n: int, ctx: JobContext, ms: float = 0.0) -> None:
    """Note the job's tenant, when it started and how long after its enqueue; await ``ms``."""
    now = time.time_ns()
    _write(f"{ctx.tenant or '-'} {now} {now - ctx.job.created_at * 1_000_000}\n")
    if ms:
        await asyncio.sleep(ms / 1000)
