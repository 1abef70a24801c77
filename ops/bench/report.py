"""Results and how they are written to ``docs/benchmarks.md``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


@dataclass(frozen=True)
class Measurement:
    """One timed run: ``jobs`` jobs in ``seconds``."""

    label: str
    jobs: int
    seconds: float
    command: str = ""

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class Section:
    """One benchmark: what was measured, the baseline, the ratios, and notes."""

    title: str
    description: str
    rows: list[tuple[Measurement, Measurement | None]] = field(default_factory=list)
    """(measurement, the baseline its ratio is taken against, if any)"""
    extra: list[str] = field(default_factory=list)
    goal: str = ""

    def markdown(self) -> str:
        lines = [f"## {self.title}", "", self.description, ""]
        if self.rows:
            lines += [
                "| measured | jobs | seconds | jobs/s | vs raw | command |",
                "|---|---:|---:|---:|---:|---|",
            ]
            for row, baseline in self.rows:
                ratio = f"{row.rate / baseline.rate:.0%}" if baseline is not None else "baseline"
                command = f"`{row.command}`" if row.command else ""
                lines.append(
                    f"| {row.label} | {row.jobs:,} | {row.seconds:.3f} | {row.rate:,.0f} "
                    f"| {ratio} | {command} |"
                )
            lines.append("")
        lines += self.extra
        if self.goal:
            lines += ["", self.goal]
        lines.append("")
        return "\n".join(lines)


def document(header: list[str], sections: list[Section], existing: str = "") -> str:
    """The results file: ``header``, then the sections. ``existing``: the file as it was; its
    sections that this run did not measure (written by other scripts or by hand) are kept where
    they were, the ones it measured are replaced, new ones go at the end."""
    fresh = {section.title: section.markdown() for section in sections}
    body: list[str] = []
    for title, text in _sections(existing):
        body.append(fresh.pop(title, text))
    body += fresh.values()
    return "\n".join(header) + "\n\n" + "\n".join(body)


def replace_sections(existing: str, sections: list[Section]) -> str:
    """``existing`` with ``sections`` in place of those of the same titles (new ones at the
    end), its header and every other section kept: for a benchmark that writes its own."""
    first = existing.find("\n## ")
    header = existing[: first + 1] if first >= 0 else existing
    return document(header.rstrip("\n").split("\n"), sections, existing)


def write_sections(path: Path, sections: list[Section]) -> str:
    """:func:`replace_sections` in the results file at ``path`` (made if missing); returns the
    new text. For the benchmarks run apart from ``python -m ops.bench``, which name their own
    commands."""
    existing = path.read_text() if path.is_file() else "# Benchmarks\n"
    text = replace_sections(existing, sections)
    path.write_text(text)
    return text


def _sections(text: str) -> list[tuple[str, str]]:
    """``(title, markdown)`` of each ``## `` section of ``text``, in order (the header before
    the first one left out)."""
    found: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            found.append((line[3:].strip(), [line]))
        elif found:
            found[-1][1].append(line)
    return [(title, "\n".join(lines).rstrip("\n") + "\n") for title, lines in found]


def goal_line(checks: list[tuple[str, bool]]) -> str:
    """'Goal: ... met' or 'not met', spelled out per criterion. Reported, never asserted."""
    parts = [f"{text}: {'met' if ok else '**not met**'}" for text, ok in checks]
    return "Goal: " + "; ".join(parts) + "."


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, round(fraction * len(sorted_values) + 0.5))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def without_output(args: list[str]) -> list[str]:
    """The arguments as given, less ``--output FILE`` (a path of the machine that ran it)."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--output":
            skip = True
            continue
        if not arg.startswith("--output="):
            kept.append(arg)
    return kept


def add_output_option(parser: argparse.ArgumentParser) -> None:
    """``--output FILE``: the results file whose section a benchmark replaces."""
    parser.add_argument(
        "--output",
        type=Path,
        default=RESULTS,
        help="the results file whose section this replaces (default: docs/benchmarks.md)",
    )
