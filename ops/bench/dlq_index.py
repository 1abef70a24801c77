"""The dead-letter index with a deep DLQ: refresh times, query times and memory.

``python -m ops.bench.dlq_index [--letters N]`` (``make bench-dlq``; N is 100,000 by default)
fills a fresh namespace with N realistic dead letters (:mod:`.dlq_letters`), then, in a child
process of its own so that its resident set is the index's alone:

1. the first :meth:`LetterIndex.refresh` (reads and decodes all N) and the RSS it added;
2. an incremental refresh after 1% more letters arrived and 1% were discarded with
   ``discard_letters``, and one with nothing new;
3. queries as a dashboard makes them, each right after a refresh (its result is cached until
   the next one, so this is the cost of a filter change): the first screen, a type wildcard,
   an error substring, a time range, a tenant, and the next page of one; and ``get`` of one
   whole letter;
4. ``read_dead_letters``, what each ``pipeline dlq`` command does, for comparison.

The section is written to ``docs/benchmarks.md`` (``--output``) and printed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import TypeVar

from pipeline import Settings
from pipeline._deadletters import (
    ALL,
    LetterFilter,
    LetterIndex,
    StatusChoice,
    discard_letters,
    read_dead_letters,
)
from pipeline._job import now_ms

from .dlq_letters import DAY_MS, PAYLOAD_BYTES, TRACEBACK_BYTES, fill_dead_letters
from .env import REPO_ROOT, broker, fresh_namespace, machine, rss_bytes, say
from .report import Section, add_output_option, goal_line, write_sections

_T = TypeVar("_T")
TITLE = "Dead-letter index"
REPEATS = 5
GOAL_S = 2.0


def _timed(action: Callable[[], _T]) -> tuple[float, _T]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def _queries(now: int) -> list[tuple[str, LetterFilter, StatusChoice]]:
    """(label, filter, status) of the dashboard's queries."""
    return [
        ("first screen: pending, newest 50", LetterFilter(), "pending"),
        ("type wildcard `email.*`", LetterFilter(types=("email.*",)), "pending"),
        ("error substring `timed out` (every attempt)", LetterFilter(error="timed out"), "all"),
        (
            "time range: a day, a week ago",
            LetterFilter(since=now - 8 * DAY_MS, until=now - 7 * DAY_MS),
            "all",
        ),
        ("tenant and reason", LetterFilter(tenants=("tenant-07",), reasons=("timeout",)), "all"),
    ]


@dataclass
class Result:
    """What the child process measured (seconds, bytes)."""

    first_refresh: float
    rss: int
    rss_trimmed: int
    indexed: int
    added: int
    incremental: float
    incremental_read: tuple[int, int]
    empty_refresh: float
    queries: list[tuple[str, float, float, int]]
    get: float
    read_dead_letters: float
    read_dead_letters_rss: int


def measure(settings: Settings, letters: int) -> Result:
    """Steps 1-4 above, in this process (which must not hold anything else)."""
    gc.collect()
    before = rss_bytes()
    with LetterIndex(settings, timeout=600) as index:
        first_s, _ = _timed(index.refresh)
        gc.collect()
        rss, indexed = rss_bytes() - before, len(index)
        rss_trimmed = _trimmed_rss() - before

        more = max(1, letters // 100)
        oldest = index.query(status="pending", limit=more, newest_first=False).letters
        fill_dead_letters(settings, more, first=letters, seed=1)
        discard_letters(settings, oldest, timeout=120)
        incremental_s, refreshed = _timed(index.refresh)
        empty_s = statistics.median(_timed(index.refresh)[0] for _ in range(REPEATS))

        queries: list[tuple[str, float, float, int]] = []
        for label, letter_filter, status in _queries(now_ms()):
            runs, total = [], 0
            for _ in range(REPEATS):
                index.refresh()  # forgets the cached results, as new letters would
                seconds, page = _timed(partial(index.query, letter_filter, status=status))
                runs.append(seconds)
                total = page.total
            queries.append((label, statistics.median(runs), max(runs), total))
        errors = LetterFilter(error="timed out")
        index.query(errors, status=ALL)
        runs = [_timed(lambda: index.query(errors, status=ALL, offset=50))[0] for _ in range(5)]
        queries.append(
            ("the next page of the error substring", statistics.median(runs), max(runs), 0)
        )
        ident = index.query(status=ALL, limit=1).letters[0].letter.id
        get_s = statistics.median(_timed(lambda: index.get(ident))[0] for _ in range(REPEATS))
    gc.collect()
    before = _trimmed_rss()
    read_s, snapshot = _timed(lambda: read_dead_letters(settings, timeout=600))
    read_rss = rss_bytes() - before
    del snapshot
    return Result(
        first_refresh=first_s,
        rss=rss,
        rss_trimmed=rss_trimmed,
        indexed=indexed,
        added=more,
        incremental=incremental_s,
        incremental_read=(refreshed.letters, refreshed.states),
        empty_refresh=empty_s,
        queries=queries,
        get=get_s,
        read_dead_letters=read_s,
        read_dead_letters_rss=read_rss,
    )


def _trimmed_rss() -> int:
    """The resident set once glibc returned the memory freed in its heaps (``malloc_trim``):
    what the index holds, without the read buffers freed but kept by the allocator."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


def _measure_in_child(settings: Settings, letters: int) -> Result:
    say(f"dlq index bench: measuring in a fresh process ({letters:,} dead letters)")
    env = {
        **os.environ,
        "PIPELINE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "PIPELINE_NAMESPACE": settings.namespace,
    }
    command = [sys.executable, "-m", "ops.bench.dlq_index", "--child", "--letters", str(letters)]
    done = subprocess.run(
        command, check=True, capture_output=True, text=True, cwd=REPO_ROOT, env=env
    )
    return Result(**json.loads(done.stdout))


def run(bootstrap_servers: str, letters: int) -> Section:
    settings = fresh_namespace(bootstrap_servers, "dlq-index")
    say(f"dlq index bench: writing {letters:,} dead letters")
    fill_s, _ = _timed(lambda: fill_dead_letters(settings, letters))
    return section(letters, fill_s, _measure_in_child(settings, letters))


def section(letters: int, fill_s: float, got: Result) -> Section:
    facts = machine()
    new, states = got.incremental_read
    lines = [
        "| step | seconds | |",
        "|---|---:|---|",
        f"| write {letters:,} dead letters (`fill_dead_letters`, transactions of 5,000) "
        f"| {fill_s:.1f} | {letters / fill_s:,.0f}/s |",
        f"| first refresh: read and decode all {got.indexed:,} | {got.first_refresh:.2f} "
        f"| {got.indexed / got.first_refresh:,.0f}/s |",
        f"| refresh after {new:,} new letters and {states:,} discarded | {got.incremental:.3f} | |",
        f"| refresh with nothing new (median of {REPEATS}) | {got.empty_refresh:.3f} | |",
        f"| `get` one whole letter by id (median of {REPEATS}) | {got.get:.3f} | |",
        f"| `read_dead_letters` (each `pipeline dlq` command) | {got.read_dead_letters:.2f} | |",
        "",
        f"| query (50 letters a page; median and max of {REPEATS}, each after a refresh) "
        "| matching | median s | max s |",
        "|---|---:|---:|---:|",
    ]
    for label, median, worst, total in got.queries:
        matching = f"{total:,}" if total else ""
        lines.append(f"| {label} | {matching} | {median:.3f} | {worst:.3f} |")
    rss, trimmed, read_rss = got.rss, got.rss_trimmed, got.read_dead_letters_rss
    lines += [
        "",
        f"Memory: the first refresh added {rss / 2**20:.0f} MB to the resident set for "
        f"{got.indexed:,} dead letters ({rss / got.indexed:,.0f} bytes each), of which the index "
        f"holds {trimmed / 2**20:.0f} MB ({trimmed / got.indexed:,.0f} bytes each: what is left "
        "once glibc's `malloc_trim` returned what the read freed; the rest is reused by later "
        f"allocations). `read_dead_letters`, which holds the whole letters, added "
        f"{read_rss / 2**20:.0f} MB ({read_rss / got.indexed:,.0f} bytes each).",
    ]
    slowest = max(worst for _, _, worst, _ in got.queries)
    checks = [(f"every query under {GOAL_S:g} s (slowest {slowest:.3f} s)", slowest < GOAL_S)]
    if letters != 100_000:
        lines.append(f"(The goal is for 100,000 dead letters; this run had {letters:,}.)")
    return Section(
        TITLE,
        f"`python -m ops.bench.dlq_index --letters {letters}` (`make bench-dlq`); "
        f"{facts['nproc']} cores, {facts['CPU']}, Python {facts['Python']}, the broker on the "
        f"same machine. {letters:,} dead letters as `ops.bench.dlq_letters` makes them: 12 job "
        f"types, 40 tenants, mostly `max_attempts` with 5 attempt errors, {PAYLOAD_BYTES}-byte "
        f"payloads and {TRACEBACK_BYTES // 1024} KB tracebacks, spread over 14 days. The index "
        "(`pipeline._deadletters.LetterIndex`) is measured in a process of its own; its memory "
        "is the growth of that process's VmRSS over the first refresh.",
        extra=lines,
        goal=goal_line(checks),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.dlq_index", description=__doc__)
    parser.add_argument("--letters", type=int, default=100_000, help="dead letters to index")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_output_option(parser)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asdict(measure(Settings(), args.letters))))
        return 0
    with broker() as kafka:
        result = run(kafka.bootstrap_servers, args.letters)
    write_sections(args.output, [result])
    print(result.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
