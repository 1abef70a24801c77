"""What a draining worker fetches: bytes and messages its consumer received from Kafka, against
a plain consumer reading the same topic once, with the worker's prefetch settings and with the
ones it had before (librdkafka's 1 MiB a partition a fetch, 2,000 messages kept queued).

A worker pauses a partition whose buffer is full, and librdkafka throws away what it had
fetched for a paused partition and not yet delivered; a backlog pauses every partition again and
again, so what is thrown away is fetched again. The counts are librdkafka's own statistics
(``rxbytes`` of every broker connection, ``rxmsgs`` of the job topic's partitions), read in the
worker process by a hook this module installs when it runs the worker (``worker`` mode).

``python -m ops.bench.fetched [--jobs N] [--rounds N] [--output FILE]``: a broker is started
unless ``PIPELINE_BOOTSTRAP_SERVERS`` is set; the section replaces its namesake in
docs/benchmarks.md (or ``--output``) and is printed.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import Settings

from .drain import ARGS, filled, hooked_drain, raw_consume
from .env import (
    HOOK_OUT_ENV,
    footer,
    hooked_parser,
    run_worker_here,
    say,
    worker_command_line,
)
from .report import Section, without_output, write_sections

BEFORE = {"queued.min.messages": "2000", "max.partition.fetch.bytes": "1048576"}
"""The prefetch the worker's consumer had before: ``queued.min.messages`` = ``buffer_size``
(2,000) and librdkafka's default ``max.partition.fetch.bytes``."""


@dataclass(frozen=True)
class Fetched:
    rxbytes: int
    rxmsgs: int
    rate: float
    """Jobs a second, first to last job (0 for the plain consumer)."""


def _totals(text: str, topic_part: str) -> tuple[int, int]:
    stats: dict[str, Any] = json.loads(text)
    rxbytes = sum(b.get("rxbytes", 0) for b in stats.get("brokers", {}).values())
    rxmsgs = sum(
        p.get("rxmsgs", 0)
        for t in stats.get("topics", {}).values()
        if topic_part in t.get("topic", "")
        for p in t.get("partitions", {}).values()
        if p.get("partition", -1) >= 0
    )
    return rxbytes, rxmsgs


def _plain(settings: Settings, jobs: int) -> Fetched:
    """One plain consumer reading every job once: the bytes the topic costs to read."""
    seen: dict[str, tuple[int, int]] = {}
    stats = {
        "isolation.level": "read_committed",
        "statistics.interval.ms": 100,
        "stats_cb": lambda text: seen.update(last=_totals(text, ".jobs.")),
    }
    topic = f"{settings.namespace}.jobs.default"
    # Polling on after the last message serves one more statistics callback.
    raw_consume(settings, topic, jobs, decode=False, conf=stats, settle_s=0.5)
    rxbytes, rxmsgs = seen.get("last", (0, 0))
    return Fetched(rxbytes, rxmsgs, 0.0)


def _worker(settings: Settings, jobs: int, group: str, conf: dict[str, str], work: Path) -> Fetched:
    env = {"PIPELINE_WORKER__KAFKA_CONSUMER": json.dumps(conf)}
    args = [*ARGS, "--group", group]
    rate, out = hooked_drain(settings, jobs, "ops.bench.fetched", args, env=env, work=work)
    rxbytes, rxmsgs = json.loads(out)
    return Fetched(rxbytes, rxmsgs, rate)


def _run_worker(argv: list[str]) -> None:
    """``worker`` mode: the worker, with librdkafka's statistics of its consumer written to
    ``$BENCH_HOOK_OUT`` every 100 ms (the last write stands)."""
    from pipeline import _brokerhealth

    out = Path(os.environ[HOOK_OUT_ENV])
    _brokerhealth.STATS_INTERVAL_MS = 100
    on_stats = _brokerhealth.BrokerHealth.on_stats

    def hooked(self: _brokerhealth.BrokerHealth, source: str, text: str) -> None:
        if source == "consumer":
            out.write_text(json.dumps(_totals(text, ".jobs.")))
        on_stats(self, source, text)

    _brokerhealth.BrokerHealth.on_stats = hooked  # type: ignore[method-assign]
    run_worker_here(argv)


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


TITLE = "What a draining worker fetches"


def section(
    jobs: int, plain: Fetched, rows: dict[str, list[Fetched]], command: str, kafka: str
) -> Section:
    """The report: the plain consumer's figures, then each prefetch's medians."""
    lines = [
        "| reader | received | vs the plain consumer | messages fetched | per job | jobs/s |",
        "|---|---:|---:|---:|---:|---:|",
        f"| plain consumer, every job once | {_mb(plain.rxbytes)} | baseline "
        f"| {plain.rxmsgs:,} | {plain.rxmsgs / jobs:.1f} | |",
    ]
    for name, label in (("before", "worker, prefetch before"), ("now", "worker, prefetch now")):
        runs = rows[name]
        rx = statistics.median(r.rxbytes for r in runs)
        msgs = statistics.median(r.rxmsgs for r in runs)
        rates = ", ".join(f"{r.rate:,.0f}" for r in runs)
        lines.append(
            f"| {label} | {_mb(rx)} | {rx / plain.rxbytes:.1f}x | {msgs:,.0f} "
            f"| {msgs / jobs:.1f} | {statistics.median(r.rate for r in runs):,.0f} ({rates}) |"
        )
    rounds = len(rows["now"])
    description = (
        f"{jobs:,} pre-filled no-op jobs in one topic of 6 partitions, drained {rounds} time(s) "
        f"each by `{worker_command_line(ARGS)}` with the prefetch it had before "
        f"(`{json.dumps(BEFORE)}`) and with the current one, alternating, each in a new group; "
        "medians of the drains (jobs/s: the median, then every drain in order)."
    )
    lines += [
        "",
        footer(command, kafka),
    ]
    return Section(TITLE, description, extra=lines)


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["worker"]:
        _run_worker(given[1:])
        return 0
    parser = hooked_parser("python -m ops.bench.fetched", __doc__, rounds=4)
    args = parser.parse_args(given)
    command = " ".join(["python -m ops.bench.fetched", *without_output(given)])
    rows: dict[str, list[Fetched]] = {"before": [], "now": []}
    with filled("fetched", args.jobs) as (kafka, settings, tmp):
        plain = _plain(settings, args.jobs)
        for n in range(1, args.rounds + 1):
            order = [("before", BEFORE), ("now", {})]
            for name, conf in order if n % 2 else reversed(order):
                say(f"fetched: round {n}/{args.rounds}: the worker, prefetch {name}")
                group = f"{settings.namespace}.workers-{name}-{n}"
                rows[name].append(_worker(settings, args.jobs, group, conf, tmp))
        description = kafka.description
    result = section(args.jobs, plain, rows, command, description)
    write_sections(args.output, [result])
    print(result.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
