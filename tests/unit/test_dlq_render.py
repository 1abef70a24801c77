"""What ``pipeline dlq``, ``pipeline jobs show`` and ``pipeline events tail`` print of dead
letters and events whose texts hold unusual characters."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from click.testing import CliRunner

from pipeline._deadletters import DeadLetterSnapshot, LetterState, LetterStatus, StoredLetter
from pipeline._deadletters import dlq_stats as stats_of
from pipeline._eventlog import JobHistory
from pipeline._human import PAYLOAD_PREVIEW_CHARS
from pipeline._job import AttemptError, Job
from pipeline._records import DeadLetter, Event
from pipeline_cli import _jobs
from pipeline_cli._dlqrender import letter_json, print_stats, row, show_lines

NOW = 1_767_225_600_000
ESC = "\x1b"
# What a hostile or careless producer or handler can put in a dead letter's texts: a terminal
# title change and a screen clear (ESC sequences), a bell, a carriage return that hides what
# came before it on the line, and a right-to-left override that reorders what follows.
NASTY = f"{ESC}]0;owned\x07{ESC}[2J\rhidden\u202e"


def nasty_letter() -> StoredLetter:
    job = Job(
        id=f"job{ESC}[1m",
        type=f"email{ESC}[31m.send",
        payload=b"{}",
        attempt=2,
        max_attempts=2,
        created_at=NOW,
        idempotency_key=f"key{ESC}[8m",
        tenant=f"acme{ESC}[5m",
        headers={"traceparent": f"00{ESC}[0m"},
        errors=[
            AttemptError(
                attempt=1,
                at=NOW,
                error_class=f"app.Error{ESC}[7m",
                message=f"first line\nsecond {NASTY}",
                retryable=True,
                worker=f"w{ESC}c",
            )
        ],
    )
    letter = DeadLetter(
        id="dl-1",
        reason=f"max_attempts{ESC}[K",
        message=f"invalid address {NASTY}",
        error_class="app.Error",
        source_topic="ns.jobs.default",
        source_partition=0,
        source_offset=1,
        job=job,
        raw_key=b"k",
        dead_at=NOW,
        traceback=f"Traceback (most recent call last):\n  {NASTY}\napp.Error: {NASTY}",
    )
    state = LetterState(status=LetterStatus.DISCARDED, at=NOW, by=f"ada{ESC}[2J@ops")
    return StoredLetter(letter, 0, 0, state)


def raw_letter() -> StoredLetter:
    letter = DeadLetter(
        id="dl-raw",
        reason="decode_error",
        message=f"cannot decode {NASTY}",
        source_topic="ns.jobs.low",
        source_partition=0,
        source_offset=2,
        raw_value=b"\x1b[2Jbytes",
        raw_key=b"\xff\xfe\x1b",
        raw_headers={f"h{ESC}[1m": b"\x1b[2J", "ok": b"fine"},
        dead_at=NOW,
    )
    return StoredLetter(letter, 0, 1)


def unprintable(texts: list[str]) -> list[str]:
    return [text for text in texts if not text.isprintable()]


@pytest.mark.parametrize("make", [nasty_letter, raw_letter])
def test_a_listing_row_prints_no_control_character(make: Callable[[], StoredLetter]) -> None:
    cells = [str(cell) for cell in row(make()) if cell is not None]
    assert unprintable(cells) == []


def test_a_listing_row_shows_control_characters_as_escapes() -> None:
    cells = row(nasty_letter())
    assert cells[2] == "email\\x1b[31m.send"
    assert str(cells[4]).startswith("Error: invalid address \\x1b]0;owned\\x07\\x1b[2J ")


@pytest.mark.parametrize("make", [nasty_letter, raw_letter])
def test_show_prints_no_control_character_and_keeps_every_line(
    make: Callable[[], StoredLetter],
) -> None:
    lines = show_lines(make())
    assert unprintable(lines) == []
    text = "\n".join(lines)
    if make is nasty_letter:
        assert "invalid address \\x1b]0;owned\\x07\\x1b[2J\\rhidden\\u202e" in text
        assert "ada\\x1b[2J@ops" in text  # who discarded it: read from the state topic
        assert "      first line" in lines  # the attempt's message, a line each
        # A carriage return breaks the line there: what came before it stays visible.
        assert "      second \\x1b]0;owned\\x07\\x1b[2J" in lines
        assert "  app.Error: \\x1b]0;owned\\x07\\x1b[2J" in lines  # the traceback
        assert "  hidden\\u202e" in lines
    else:
        assert "  h\\x1b[1m: 0x1b5b324a" in lines
        assert "key           0xfffe1b" in lines


def test_stats_print_no_control_character(capsys: pytest.CaptureFixture[str]) -> None:
    pending = nasty_letter()
    pending.state = None
    print_stats(stats_of(DeadLetterSnapshot("ns.dlq", [pending, raw_letter()])), False)
    lines = capsys.readouterr().out.splitlines()
    assert unprintable(lines) == []
    assert any(line.startswith("email\\x1b[31m.send ") for line in lines)


def test_a_payload_nested_deeper_than_json_reads_is_shown_as_base64() -> None:
    """Another producer's payload, JSON nested a thousand deep: one such letter broke ``ls
    --json``, ``show`` and ``replay --dry-run --json`` for every letter with a traceback."""
    deep = b"[" * 1_000 + b"]" * 1_000
    stored = nasty_letter()
    assert stored.letter.job is not None
    stored.letter.job.payload = deep
    shown = letter_json(stored)
    assert shown["job"]["payload_format"] == "base64"
    assert show_lines(stored)


def test_show_prints_a_preview_of_a_large_json_payload_and_json_has_it_whole() -> None:
    """A 600 KB list pretty-prints to 200,000 lines (9 MB: 3 million, 525 MB to print)."""
    payload = json.dumps({"ids": [0] * 200_000}).encode()
    stored = nasty_letter()
    assert stored.letter.job is not None
    stored.letter.job.payload = payload
    lines = show_lines(stored)
    assert len("\n".join(lines)) < 2 * PAYLOAD_PREVIEW_CHARS  # each line indented 2 more
    cut = f"  … truncated ({len(payload):,} bytes in all; --json for all)"
    assert lines[lines.index(cut) - 1].startswith("      0")  # the preview, then the line
    assert lines[lines.index(cut) + 1].startswith("attempts")
    assert letter_json(stored)["job"]["payload"] == {"ids": [0] * 200_000}


def nasty_event() -> Event:
    return Event(
        job_id="job-1",
        job_type=f"email{ESC}[31m.send",
        kind="progress",
        attempt=1,
        priority="default",
        at=NOW,
        detail=f"step {NASTY}",
        worker=f"w{ESC}c",
    )


NOWHERE = ["--bootstrap-servers", "127.0.0.1:1"]


def test_jobs_show_prints_no_control_character(monkeypatch: pytest.MonkeyPatch) -> None:
    history = JobHistory("job-1", [nasty_event()], [nasty_letter()], 1)
    monkeypatch.setattr(_jobs, "job_history", lambda settings, job_id, timeout: history)
    result = CliRunner().invoke(_jobs.jobs, ["show", "job-1", *NOWHERE])
    assert result.exit_code == 0, result.output
    assert unprintable(result.output.splitlines()) == []
    assert "email\\x1b[31m.send" in result.output
    assert "step \\x1b]0;owned\\x07\\x1b[2J hidden\\u202e" in result.output  # the detail
    assert "invalid address \\x1b]0;owned\\x07" in result.output  # the dead letter's error
    # --json stays whole: a JSON reader gets the texts as they were written
    result = CliRunner().invoke(_jobs.jobs, ["show", "job-1", "--json", *NOWHERE])
    assert "email\\u001b[31m.send" in result.output


def test_events_tail_prints_no_control_character(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_jobs, "follow_events", lambda *args, **kwargs: iter([nasty_event()]))
    result = CliRunner().invoke(_jobs.events, ["tail", *NOWHERE])
    assert result.exit_code == 0, result.output
    assert unprintable(result.output.splitlines()) == []
    assert "email\\x1b[31m.send" in result.output
    assert "w\\x1bc" in result.output


def test_jobs_show_warns_of_the_job_s_records_it_could_not_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    history = JobHistory("job-1", [], [], 7, unreadable=2)
    monkeypatch.setattr(_jobs, "job_history", lambda settings, job_id, timeout: history)
    result = CliRunner().invoke(_jobs.jobs, ["show", "job-1", *NOWHERE])
    assert result.exit_code == 1
    assert "left out 2 records of job job-1" in result.stderr
    assert "nothing known about job job-1" in result.stderr
