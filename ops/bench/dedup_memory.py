"""Deduplication state: memory per key of a ``DedupTable`` and the time of expiry and restore.

``python -m ops.bench.dedup_memory [--keys N]`` prints a Markdown report. Each structure is
built in a child process of its own, from nothing, holding N keys such as ``order-123456`` with
32-hex job ids as pipeline makes them. Its size is measured twice: by tracemalloc (every byte
Python allocated for it, keys and ids included) and as the growth of the process's resident
set (VmRSS, measured in a separate build, without tracemalloc). The baseline, a plain
``dict[str, str]`` of the same keys and job ids, is measured the same way in the same run.
No Kafka is involved. The section is written to ``docs/benchmarks.md`` (``--output``).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
import tracemalloc
from collections import deque
from collections.abc import Callable

from pipeline._dedup import (
    DedupPolicy,
    Entry,
    KeyOutcome,
    changelog_key,
    encode_entry,
)
from pipeline._deduptable import DedupTable, restore_record
from pipeline._job import new_job_id

from .env import REPO_ROOT, machine, rss_bytes, say
from .report import Section, add_output_option, write_sections

START_MS = 1_760_000_000_000
HOUR_MS = 3_600_000
POLICY = DedupPolicy()  # until_complete, 1 hour

STRUCTURES = {
    "baseline": "`dict[str, str]`: key -> job id (baseline)",
    "claimed": "`DedupTable`, every key claimed by `check` (pending)",
    "completed": "`DedupTable`, every key claimed, then settled SUCCEEDED (until_complete)",
    "restored": "`DedupTable`, every key restored by `put`",
    "tuples": "alternative: `dict[str, tuple[str, bool, int]]` + a deque of (expiry, key)",
}


def _at(n: int, keys: int) -> int:
    """When key ``n`` arrives: the keys are spread evenly over one hour."""
    return START_MS + n * HOUR_MS // keys


def _build(structure: str, keys: int) -> object:
    """``structure`` holding ``keys`` keys, made from nothing (keys and ids included)."""
    if structure == "baseline":
        return {f"order-{n}": new_job_id() for n in range(keys)}
    if structure == "tuples":
        entries: dict[str, tuple[str, bool, int]] = {}
        expiries: deque[tuple[int, str]] = deque()
        for n in range(keys):
            key, expires = f"order-{n}", _at(n, keys) + HOUR_MS
            entries[key] = (new_job_id(), False, expires)
            expiries.append((expires, key))
        return entries, expiries
    table = DedupTable()
    for n in range(keys):
        key, job_id, now = f"order-{n}", new_job_id(), _at(n, keys)
        if structure == "restored":
            table.put(key, Entry(job_id, True, now + HOUR_MS), now)
            continue
        table.check(key, job_id, now, POLICY.ttl_ms)
        if structure == "completed":
            # Settled a little later than claimed, as a job that ran for a while.
            table.settle(key, job_id, KeyOutcome.SUCCEEDED, POLICY, now + 1_500)
    return table


def _child(structure: str, keys: int) -> dict[str, float]:
    """Measure one structure in this (fresh) process."""
    gc.collect()
    rss_before = rss_bytes()
    built = _build(structure, keys)
    rss = rss_bytes() - rss_before
    del built
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    built = _build(structure, keys)
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert built is not None
    return {"traced": traced, "rss": rss}


def _measure(structure: str, keys: int) -> dict[str, float]:
    say(f"dedup bench: building {structure} with {keys:,} keys")
    out = subprocess.run(
        [sys.executable, "-m", "ops.bench.dedup_memory", "--child", structure, "--keys", str(keys)],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def _timed(action: Callable[[], object]) -> float:
    gc.collect()
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _timings(keys: int) -> list[tuple[str, float]]:
    """(operation, seconds) for ``keys`` keys, each on a table of its own."""
    ids = [new_job_id() for _ in range(keys)]
    names = [f"order-{n}" for n in range(keys)]
    at = [_at(n, keys) for n in range(keys)]
    entries = [Entry(j, True, t + HOUR_MS) for j, t in zip(ids, at, strict=True)]
    records = [
        (changelog_key("high", k), encode_entry(j, True, t + HOUR_MS))
        for k, j, t in zip(names, ids, at, strict=True)
    ]
    rows: list[tuple[str, float]] = []

    def claim_all() -> None:
        check = DedupTable().check
        for key, job_id, now in zip(names, ids, at, strict=True):
            check(key, job_id, now, HOUR_MS)

    def restore_all() -> DedupTable:
        table = DedupTable()
        for key, entry in zip(names, entries, strict=True):
            table.put(key, entry, START_MS)
        return table

    def fold_all() -> None:
        tables = {"high": DedupTable()}
        for key, value in records:
            restore_record(tables, key, value, START_MS)

    rows.append(("`check` (claim) of a new key", _timed(claim_all)))
    rows.append(("restore-style `put` of an `Entry`", _timed(restore_all)))
    table = restore_all()
    end = START_MS + 2 * HOUR_MS
    rows.append(("`expire` of every key, one call", _timed(lambda: table.expire(end))))
    assert len(table) == 0
    table = restore_all()
    seconds = range(START_MS + HOUR_MS, end + 1, 1_000)
    every_second = _timed(lambda: [table.expire(now) for now in seconds])
    rows.append(("`expire` of every key, once a second over the hour", every_second))
    assert len(table) == 0
    rows.append(("restore fold of a changelog record (`restore_record`)", _timed(fold_all)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.dedup_memory", description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys per structure")
    parser.add_argument("--child", choices=STRUCTURES, help=argparse.SUPPRESS)
    add_output_option(parser)
    args = parser.parse_args(argv)
    keys: int = args.keys
    if args.child:
        print(json.dumps(_child(args.child, keys)))
        return 0

    sizes = {structure: _measure(structure, keys) for structure in STRUCTURES}
    say(f"dedup bench: timing operations on {keys:,} keys")
    timings = _timings(keys)
    facts = machine()
    base = sizes["baseline"]["traced"]
    lines = [
        "## Deduplication state: memory and time",
        "",
        f"`python -m ops.bench.dedup_memory --keys {keys}`; {facts['nproc']} cores, "
        f"{facts['CPU']}, Python {facts['Python']}. {keys:,} keys `order-<n>` with 32-hex job "
        "ids, arriving evenly over one hour, TTL one hour. Each structure is built from nothing "
        "in a fresh process; tracemalloc counts every byte allocated for it (keys and ids "
        "included), RSS is the growth of the resident set in a separate build.",
        "",
        "| structure | bytes/key (tracemalloc) | vs baseline | bytes/key (RSS) | MB (RSS) |",
        "|---|---:|---:|---:|---:|",
    ]
    for structure, label in STRUCTURES.items():
        traced, rss = sizes[structure]["traced"], sizes[structure]["rss"]
        lines.append(
            f"| {label} | {traced / keys:.1f} | {traced / base:.0%} | {rss / keys:.1f} "
            f"| {rss / 2**20:.0f} |"
        )
    lines += [
        "",
        "| operation | keys | seconds | µs/key |",
        "|---|---:|---:|---:|",
    ]
    for label, seconds in timings:
        lines.append(f"| {label} | {keys:,} | {seconds:.3f} | {seconds / keys * 1e6:.2f} |")
    section = Section(lines[0].removeprefix("## "), lines[2], extra=lines[4:])
    write_sections(args.output, [section])
    print(section.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
