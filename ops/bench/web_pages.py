"""The dashboard's pages with a deep DLQ, timed in Chromium: the overview and the dead-letter
pages with 100,000 dead letters, against the same pages with none.

``python -m ops.bench.web_pages [--letters N]`` (``make bench-web``; N is 100,000 by default)
fills a fresh namespace with N realistic dead letters (:mod:`.dlq_letters`), starts
``pipeline web`` on it, waits until its index holds them all, then loads each page in headless
Chromium and takes the navigation's duration (request sent to the load event: the server's
render, the transfer and the browser's layout). Each dead-letter query is a filter change: a
filter not asked before, so the index scans for it. The same pages of an empty namespace,
served by a second ``pipeline web``, are the baseline. The section is written to
``docs/benchmarks.md`` (``--output``) and printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from ops.browser import headless_chromium
from ops.webproc import WebProcess, spawn_web

from .dlq_letters import fill_dead_letters
from .env import broker, fresh_namespace, machine, say
from .report import Section, add_output_option, goal_line, write_sections

if TYPE_CHECKING:
    from collections.abc import Callable

    from selenium.webdriver.remote.webdriver import WebDriver

    from pipeline import Settings

TITLE = "Dashboard"
REPEATS = 7
OVERVIEW_GOAL_S = 0.5
LETTERS_GOAL_S = 2.0
_LOAD = (
    "const n = performance.getEntriesByType('navigation')[0];"
    "return [n.loadEventEnd - n.startTime, n.responseStart - n.requestStart];"
)


def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(0.2)


def _start(settings: Settings, log: Path) -> WebProcess:
    server = spawn_web(settings, log)
    exited = server.process.poll
    _wait(lambda: server.listening() or exited() is not None, 60, "pipeline web to listen")
    if exited() is not None:
        raise RuntimeError(f"pipeline web exited:\n{server.output()}")
    return server


def _load(driver: WebDriver, url: str) -> tuple[float, float]:
    """Seconds from the request to the load event, and to the first byte of the answer."""
    driver.get(url)
    total_ms, server_ms = driver.execute_script(_LOAD)
    return total_ms / 1000, server_ms / 1000


def _indexed(driver: WebDriver, server: WebProcess, letters: int) -> bool:
    # A filter matching every letter that no measured page asks for, so that what this
    # scans is not cached for them.
    driver.get(server.url + "dead-letters?status=all&since=1970-01-01")
    count = driver.find_element("id", "match-count").text.split(" ", 1)[0]
    return count.replace(",", "") == str(letters)


QUERIES: list[tuple[str, dict[str, str]]] = [
    ("first screen (pending, newest first)", {}),
    ("type wildcard `email.*`", {"type": "email.*"}),
    ("error text `timed out`", {"error": "timed out"}),
    ("tenant", {"tenant": "tenant-07"}),
    ("time range (a day, a week ago)", {"since": "8d", "until": "7d"}),
    ("reason and tenant", {"reason": "fatal_error", "tenant": "tenant-11"}),
    ("status all, page 3", {"status": "all", "page": "3"}),
]
"""The dead-letter pages loaded, in this order: each a filter not asked before."""


@dataclass(frozen=True)
class PageTimes:
    overview: list[float]
    """Load times of the overview, :data:`REPEATS` loads."""
    queries: list[tuple[str, float, float]]
    """(query, load seconds, server seconds to the first byte), each filter asked once."""


def measure(settings: Settings, server: WebProcess, driver: WebDriver) -> PageTimes:
    driver.get(server.url)  # warm: the first reading is there
    overview = [_load(driver, server.url)[0] for _ in range(REPEATS)]
    queries = []
    for label, fields in QUERIES:
        url = server.url + "dead-letters" + (f"?{urlencode(fields)}" if fields else "")
        total, first_byte = _load(driver, url)
        queries.append((label, total, first_byte))
    return PageTimes(overview, queries)


def run(bootstrap_servers: str, letters: int, work: Path) -> Section:
    deep = fresh_namespace(bootstrap_servers, "web-deep")
    empty = fresh_namespace(bootstrap_servers, "web-empty")
    say(f"dashboard bench: writing {letters:,} dead letters")
    started = time.monotonic()
    fill_dead_letters(deep, letters)
    say(f"  written in {time.monotonic() - started:.1f} s")
    servers = [_start(deep, work / "web-deep.log"), _start(empty, work / "web-empty.log")]
    driver = headless_chromium()
    try:
        started = time.monotonic()
        _wait(lambda: _indexed(driver, servers[0], letters), 600, "the index to hold them all")
        indexed_s = time.monotonic() - started
        got = measure(deep, servers[0], driver)
        baseline = measure(empty, servers[1], driver)
    finally:
        driver.quit()
        for server in servers:
            server.stop()
    return section(letters, indexed_s, got, baseline)


def section(letters: int, indexed_s: float, got: PageTimes, baseline: PageTimes) -> Section:
    facts = machine()
    overview = statistics.median(got.overview)
    empty_overview = statistics.median(baseline.overview)
    lines = [
        f"| page | {letters:,} dead letters: load s | of which to first byte | "
        "no dead letters: load s | ratio |",
        "|---|---:|---:|---:|---:|",
        f"| overview (median of {REPEATS}) | {overview:.3f} | | {empty_overview:.3f} "
        f"| {overview / empty_overview:.1f}x |",
    ]
    for (label, total, first), (_, empty_total, _) in zip(
        got.queries, baseline.queries, strict=True
    ):
        lines.append(
            f"| dead letters: {label} | {total:.3f} | {first:.3f} | {empty_total:.3f} "
            f"| {total / empty_total:.1f}x |"
        )
    lines += [
        "",
        f"The dashboard's first index refresh of the {letters:,} letters was done within "
        f"{indexed_s:.1f} s of the server's start (pages render meanwhile, with the letters "
        "read so far).",
    ]
    slowest = max(total for _, total, _ in got.queries)
    checks = [
        (f"overview under {OVERVIEW_GOAL_S:g} s (median {overview:.3f} s)", overview < 0.5),
        (
            f"every dead-letter page under {LETTERS_GOAL_S:g} s (slowest {slowest:.3f} s)",
            slowest < LETTERS_GOAL_S,
        ),
    ]
    if letters != 100_000:
        lines.append(f"(The goals are for 100,000 dead letters; this run had {letters:,}.)")
    return Section(
        TITLE,
        f"`python -m ops.bench.web_pages --letters {letters}` (`make bench-web`); "
        f"{facts['nproc']} cores, {facts['CPU']}, Python {facts['Python']}, the broker, "
        "`pipeline web` and headless Chromium on the same machine. Each time is one page "
        "load in Chromium, from the request to the load event (Navigation Timing); each "
        "dead-letter row is a filter not asked before. The baseline is the same page of an "
        "empty namespace, served by a second `pipeline web`.",
        extra=lines,
        goal=goal_line(checks),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.web_pages", description=__doc__)
    parser.add_argument("--letters", type=int, default=100_000, help="dead letters to write")
    add_output_option(parser)
    args = parser.parse_args(argv)
    with broker() as kafka, tempfile.TemporaryDirectory(prefix="pipeline-bench-web-") as work:
        result = run(kafka.bootstrap_servers, args.letters, Path(work))
    write_sections(args.output, [result])
    print(result.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
