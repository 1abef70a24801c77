"""How ``pipeline dlq`` shows dead letters: tables, the ``show`` page, JSON, summaries."""

from __future__ import annotations

import base64
import dataclasses
from collections import Counter
from typing import TYPE_CHECKING, Any

import click

from pipeline._deadletters import (
    DlqStats,
    LetterStatus,
    StoredLetter,
    WriteReport,
    nothing_to_replay,
)
from pipeline._human import PREVIEW_BYTES, bytes_text, hexdump, pretty_json, when
from pipeline._job import Job, PayloadEncoding
from pipeline._jsonpayload import read_json

from ._output import print_json, print_table

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from pipeline._deadletters import DeadLetterSnapshot, LetterState

_ERROR_WIDTH = 48


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def shown(value: object) -> object:
    """``value`` safe to print to a terminal: a string's characters that are not printable
    (control characters such as ESC, which start terminal escape sequences, line breaks,
    bidirectional overrides...) written as Python escapes (``\\x1b``, ``\\n``, ``\\u202e``).
    Dead letters carry what producers and handlers wrote: printed as they are, an error
    message could rewrite the operator's screen, title or clipboard, or hide other lines."""
    if not isinstance(value, str) or value.isprintable():
        return value
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)


def _lines(text: str) -> list[str]:
    """The lines of a multi-line text, each :func:`shown`."""
    return [str(shown(line)) for line in text.splitlines()]


def plural(count: int, noun: str = "dead letter") -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _payload(job: Job) -> tuple[Any, str]:
    """The payload for JSON output: the decoded value and ``json``, or base64 and ``base64``."""
    if job.payload_encoding is PayloadEncoding.JSON:
        try:
            return read_json(job.payload), "json"
        except ValueError:
            pass
    return _b64(job.payload), "base64"


def _job_json(job: Job) -> dict[str, Any]:
    payload, payload_format = _payload(job)
    return {
        "id": job.id,
        "type": job.type,
        "payload": payload,
        "payload_format": payload_format,
        "payload_encoding": job.payload_encoding.value,
        "priority": job.priority.value,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "created_at": job.created_at,
        "not_before": job.not_before,
        "idempotency_key": job.idempotency_key,
        "tenant": job.tenant,
        "headers": job.headers,
        "errors": [dataclasses.asdict(error) for error in job.errors],
    }


def _state_json(state: LetterState | None) -> dict[str, Any] | None:
    if state is None:
        return None
    return {
        "status": state.status.value,
        "at": state.at,
        "at_iso": when(state.at),
        "by": state.by,
        "to": state.to,
        "job_id": state.job_id,
    }


def letter_json(stored: StoredLetter) -> dict[str, Any]:
    """Every field of a dead letter, JSON-ready (bytes as base64)."""
    letter = stored.letter
    return {
        "id": letter.id,
        "job_id": letter.job_id,
        "job_type": letter.job_type,
        "status": stored.status.value,
        "state": _state_json(stored.state),
        "reason": letter.reason,
        "error_class": letter.error_class,
        "message": letter.message,
        "dead_at": letter.dead_at,
        "dead_at_iso": when(letter.dead_at),
        "tenant": letter.tenant,
        "source_topic": letter.source_topic,
        "source_partition": letter.source_partition,
        "source_offset": letter.source_offset,
        "dlq_partition": stored.partition,
        "dlq_offset": stored.offset,
        "job": None if letter.job is None else _job_json(letter.job),
        "raw_value": _b64(letter.raw_value),
        "raw_key": _b64(letter.raw_key),
        "raw_headers": {name: _b64(value) for name, value in letter.raw_headers.items()},
        "traceback": letter.traceback,
    }


def _error_cell(stored: StoredLetter) -> str:
    letter = stored.letter
    short = (letter.error_class or "").rpartition(".")[2]
    text = f"{short}: {letter.message}" if short else letter.message
    text = str(shown(" ".join(text.split())))
    return text if len(text) <= _ERROR_WIDTH else text[: _ERROR_WIDTH - 1] + "…"


def _source(stored: StoredLetter) -> str:
    letter = stored.letter
    return f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset}"


COLUMNS = ["id", "job id", "type", "reason", "error", "attempts", "dead at", "source", "status"]


def row(stored: StoredLetter) -> list[object]:
    letter, job = stored.letter, stored.letter.job
    cells: list[object] = [
        letter.id,
        letter.job_id,
        letter.job_type,
        letter.reason,
        _error_cell(stored),
        None if job is None else f"{job.attempt}/{job.max_attempts}",
        when(letter.dead_at),
        _source(stored),
        stored.status.value,
    ]
    return [shown(cell) for cell in cells]


def warn_undecodable(snapshot: DeadLetterSnapshot) -> None:
    if snapshot.undecodable:
        click.echo(
            f"warning: left out {plural(snapshot.undecodable, 'record')} of {snapshot.topic} "
            "that could not be decoded as dead letters "
            "(`pipeline --log-level INFO dlq ...` says where)",
            err=True,
        )


def skipped_text(skipped: Counter[LetterStatus], empty: int = 0) -> str:
    """What was left alone: already replayed or discarded, then (``empty``) the letters
    holding nothing to replay."""
    parts = []
    if skipped[LetterStatus.REPLAYED]:
        parts.append(f"{skipped[LetterStatus.REPLAYED]} already replayed")
    if skipped[LetterStatus.DISCARDED]:
        parts.append(f"{skipped[LetterStatus.DISCARDED]} discarded")
    text = f" ({', '.join(parts)}, skipped)" if parts else ""
    return f"{text}; {nothing_to_replay(empty)}" if empty else text


def targets_text(topics: Iterable[str | None]) -> str:
    counts = Counter(str(shown(t)) for t in topics if t is not None)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{topic} ({count})" for topic, count in sorted(counts.items()))


def show_lines(stored: StoredLetter) -> list[str]:
    letter, job, state = stored.letter, stored.letter.job, stored.state
    status = stored.status.value
    if state is not None:
        status += f" at {when(state.at)} by {state.by}" + (f" to {state.to}" if state.to else "")
    last = f"{letter.error_class}: {letter.message}" if letter.error_class else letter.message
    fields: list[tuple[str, object]] = [
        ("dead letter", letter.id),
        ("status", status),
        ("reason", letter.reason),
        ("error", last),
        ("dead at", when(letter.dead_at)),
        ("source", _source(stored)),
        ("dlq position", f"[{stored.partition}]@{stored.offset}"),
        ("tenant", letter.tenant),
        ("key", bytes_text(letter.raw_key)),
    ]
    if job is not None:
        fields += [
            ("job", job.id),
            ("type", job.type),
            ("priority", job.priority.value),
            ("attempt", f"{job.attempt} of {job.max_attempts}"),
            ("created at", when(job.created_at)),
            ("not before", when(job.not_before)),
            ("idempotency key", job.idempotency_key),
            ("headers", ", ".join(f"{k}={v}" for k, v in job.headers.items()) or None),
        ]
    width = max(len(name) for name, _ in fields)
    lines = [
        f"{name.ljust(width)}  {'-' if value is None else shown(str(value))}"
        for name, value in fields
    ]
    if job is not None:
        payload, payload_format = _payload(job)
        lines.append(f"payload ({job.payload_encoding.value}, {len(job.payload)} bytes):")
        text = (
            pretty_json(payload, len(job.payload), "--json for all")
            if payload_format == "json"
            else hexdump(job.payload)
        )
        lines += ["  " + line for line in _lines(text)]
        lines.append(f"attempts ({len(job.errors)} failed):" if job.errors else "attempts: none")
        for error in job.errors:
            retry = "retryable" if error.retryable else "not retryable"
            extra = ", ".join(
                x
                for x in [retry, error.worker and f"worker {error.worker}", error.traceback_digest]
                if x
            )
            head = f"#{error.attempt}  {when(error.at)}  {error.error_class} ({extra})"
            lines.append(f"  {shown(head)}")
            lines += ["      " + line for line in _lines(error.message) or [""]]
    if letter.traceback:
        lines.append("traceback (last error):")
        lines += ["  " + line for line in _lines(letter.traceback)]
    if letter.raw_value is not None:
        lines.append(f"raw value ({len(letter.raw_value)} bytes):")
        lines += ["  " + line for line in hexdump(letter.raw_value).splitlines()]
        lines.append(f"  base64: {_b64(letter.raw_value[:PREVIEW_BYTES])}")
    if letter.raw_headers:
        lines.append("raw headers:")
        lines += [f"  {shown(f'{k}: {bytes_text(v)}')}" for k, v in letter.raw_headers.items()]
    return lines


def print_write(as_json: bool, verb: str, report: WriteReport) -> None:
    if as_json:
        print_json(
            {
                f"{verb}ed": [
                    {
                        "id": s.letter.id,
                        "job_id": s.letter.job_id,
                        "to": s.state.to if s.state else None,
                    }
                    for s in report.done
                ],
                "skipped": {status.value: count for status, count in report.skipped.items()},
                # Pending, with nothing to send: a replay leaves them (a discard clears them).
                **(
                    {"nothing_to_replay": [s.letter.id for s in report.empty]}
                    if verb == "replay"
                    else {}
                ),
            }
        )
        return
    done = report.done
    where = f" to {targets_text(s.state.to for s in done if s.state)}" if verb == "replay" else ""
    past = "replayed" if verb == "replay" else "discarded"
    if not done:
        click.echo(f"nothing to {verb}{skipped_text(report.skipped, len(report.empty))}")
        return
    click.echo(
        f"{past} {plural(len(done))}{where}{skipped_text(report.skipped, len(report.empty))}"
    )


def listing_summary(
    matching: Sequence[StoredLetter], shown: int, listed: int, show_all: bool
) -> str:
    """The line after ``ls``: how many are shown, and the rest by status."""
    counts = Counter(s.status for s in matching)
    replayed, discarded = counts[LetterStatus.REPLAYED], counts[LetterStatus.DISCARDED]
    head = plural(shown)
    if listed < shown:
        head = f"showing {listed} of {head}"
    if show_all:
        tail = f"{counts[LetterStatus.PENDING]} pending, {replayed} replayed, {discarded} discarded"
    else:
        tail = f"{replayed} replayed, {discarded} discarded hidden"
    return f"{head} ({tail})"


def print_stats(counts: DlqStats, as_json: bool) -> None:
    if as_json:
        print_json(
            {
                **counts.by_status,
                "depth": counts.depth,
                "pending_by_reason": counts.pending_by_reason,
                "pending_by_type": counts.pending_by_type,
                "undecodable": counts.undecodable,
            }
        )
        return
    by_status = counts.by_status
    click.echo(
        f"{by_status['pending']} pending ({by_status['replayed']} replayed, "
        f"{by_status['discarded']} discarded)"
    )
    for title, table in [("reason", counts.pending_by_reason), ("type", counts.pending_by_type)]:
        if table:
            click.echo()
            print_table([(shown(name), count) for name, count in table.items()], [title, "pending"])
