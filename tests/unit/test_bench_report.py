"""``docs/benchmarks.md`` written by ``python -m ops.bench``: measured sections replaced, the
others (from other scripts or by hand) kept where they were."""

from __future__ import annotations

from pathlib import Path

from ops.bench.report import Section, document, replace_sections, write_sections

EXISTING = """# Benchmarks

- Date: earlier

## (a) Enqueue throughput

old numbers

## Idempotency keys

written by another script

| a | b |

## Scheduler

old scheduler numbers
"""


def test_measured_sections_are_replaced_and_the_others_kept_in_place() -> None:
    sections = [
        Section("(a) Enqueue throughput", "new numbers"),
        Section("Scheduler", "new scheduler numbers"),
        Section("(c) Enqueue-to-start latency", "a section the file did not have"),
    ]
    text = document(["# Benchmarks", "", "- Date: now"], sections, EXISTING)
    titles = [line for line in text.splitlines() if line.startswith("## ")]
    assert titles == [
        "## (a) Enqueue throughput",
        "## Idempotency keys",
        "## Scheduler",
        "## (c) Enqueue-to-start latency",
    ]
    assert "- Date: now" in text
    assert "earlier" not in text
    assert "old numbers" not in text
    assert "old scheduler numbers" not in text
    assert "new numbers" in text
    assert "written by another script\n\n| a | b |\n" in text


def test_without_an_existing_file_the_sections_are_written_in_order() -> None:
    sections = [Section("One", "first"), Section("Two", "second")]
    text = document(["# Benchmarks"], sections)
    assert text == "# Benchmarks\n\n" + sections[0].markdown() + "\n" + sections[1].markdown()


def test_a_benchmark_run_apart_replaces_its_section_and_keeps_the_header(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text(EXISTING)
    text = write_sections(path, [Section("Idempotency keys", "newer keys")])
    assert path.read_text() == text
    assert text.startswith("# Benchmarks\n\n- Date: earlier\n\n## (a) Enqueue throughput\n")
    assert "written by another script" not in text
    assert "## Idempotency keys\n\nnewer keys\n" in text
    assert "old scheduler numbers" in text
    fresh = write_sections(tmp_path / "new.md", [Section("One", "first")])
    assert fresh == "# Benchmarks\n\n" + Section("One", "first").markdown()


def test_a_benchmark_of_its_own_replaces_its_section_and_keeps_the_header() -> None:
    existing = "# Benchmarks\n\nheader text\n\n## A\n\nold a\n\n## B\n\nb\n"
    text = replace_sections(existing, [Section("A", "new a")])
    assert text.startswith("# Benchmarks\n\nheader text\n\n## A\n\nnew a\n")
    assert "old a" not in text
    assert text.endswith("## B\n\nb\n")
    assert replace_sections(text, [Section("A", "new a")]) == text
    added = replace_sections(existing, [Section("C", "c")])
    assert added.startswith("# Benchmarks\n\nheader text\n\n## A\n\nold a\n")
    assert added.rstrip("\n").endswith("## B\n\nb\n\n## C\n\nc")
