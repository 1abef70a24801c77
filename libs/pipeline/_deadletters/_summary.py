"""Summaries of dead letters: what :class:`~pipeline._deadletters.LetterIndex` keeps of each.

A summary is the letter without its payload, raw bytes (empty ones stand for them), headers and
traceback, with its repeated
strings (job types, error classes, messages, topics...) shared between letters: about 1.7 KB
against about 10 KB for a whole letter. It keeps every field the filters and a listing need,
the attempt history included.
"""

from __future__ import annotations

from dataclasses import replace

from .._records import DeadLetter


class SharedStrings:
    """One copy of each repeated string (job types, error classes, messages, topics...)."""

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}

    def __call__(self, text: str | None) -> str | None:
        return None if text is None else self._seen.setdefault(text, text)

    def clear(self) -> None:
        self._seen.clear()


def summary_of(letter: DeadLetter, share: SharedStrings) -> DeadLetter:
    """``letter`` without its payload, raw bytes, headers and traceback, its strings shared."""
    job = letter.job
    if job is not None:
        job = replace(
            job,
            type=share(job.type) or "",
            payload=b"",
            headers={},
            tenant=share(job.tenant),
            errors=[
                replace(
                    error,
                    error_class=share(error.error_class) or "",
                    message=share(error.message) or "",
                    traceback_digest=share(error.traceback_digest),
                    worker=share(error.worker),
                )
                for error in job.errors
            ],
        )
    return replace(
        letter,
        job=job,
        job_type=share(letter.job_type),
        reason=share(letter.reason) or "",
        message=share(letter.message) or "",
        error_class=share(letter.error_class),
        source_topic=share(letter.source_topic) or "",
        tenant=share(letter.tenant),
        # Empty, not None, where it held raw bytes: a replay still finds something to send.
        raw_value=None if letter.raw_value is None else b"",
        raw_key=None,
        raw_headers={},
        traceback=None,
    )
